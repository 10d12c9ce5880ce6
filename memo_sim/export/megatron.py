"""Megatron-LM: a ``pretrain_gpt.py`` launch script with the plan's model, layout, batch split and
recompute settings as Megatron-LM's command-line arguments.

Option names and values as NVIDIA/Megatron-LM defines them (`SOURCE`): the literal arguments of
``megatron/training/arguments.py`` and those its ``ArgumentGroupFactory`` derives from
``TransformerConfig`` / ``ModelParallelConfig`` fields (``--tensor-model-parallel-size``,
``--recompute-granularity`` ...). Megatron-LM expresses TP with SP, ring CP, Ulysses as
TransformerEngine's all-to-all CP (``--cp-comm-type a2a``, ``a2a+p2p`` beside a ring), PP with interleaving
(``--num-virtual-stages-per-pipeline-rank``), DP with the distributed optimizer (ZeRO 1) or Megatron-FSDP
(ZeRO 3: ``--use-megatron-fsdp``), and full recompute; the rest of a plan is a `Gap`.
"""

from __future__ import annotations

import shlex
from dataclasses import replace

from memo_sim.export.base import alloc_env, alloc_gap, kept_launch
from memo_sim.export.base import (Export, Gap, NoNearest, PlanChange, async_tp_gap, balance_gap, dp_flavour_gap,
                                  gemm_format_gap, metp_gap, nearest_batch, nearest_model, nearest_plan,
                                  not_modelled_gap, optimizer_offload_gap, policy_gaps, price_nearest, shape_arguments,
                                  torchrun_line, ulysses_gap, zero_gap)
from memo_sim.layout.kv_heads import kv_heads_why_not
from memo_sim.layout.parallel import check_layout
from memo_sim.model.rope import YARN_PARAMS, llama3_rope_factor, yarn_params
from memo_sim.layout.pipeline_layout import format_layout
from memo_sim.layout.rank_order import MEGATRON_OPTION as RANK_ORDER_OPTION
from memo_sim.plan.schema import Plan
from memo_sim.policy.registry import policy_class
from memo_sim.search.frameworks import get_framework

FRAMEWORK = "megatron"  # its version in memo_sim/frameworks/data (the plans exported instead)
SOURCE = "NVIDIA/Megatron-LM@d98e8a64 (2026-08-22)"
FILE = "megatron.sh"

# each policy Megatron-LM runs, as its recompute arguments (`_recompute_args`; words for the export's notes)
_RECOMPUTE = {"store_all": [],
              "full_recompute": [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                                 ("--recompute-num-layers", "1")],
              # the attention core re-run before its backward (Korthikanti et al.; core_attn, the modules' default)
              "selective_recompute": [("--recompute-granularity", "selective")],
              # named modules (`memo_sim.policy.recompute_modules`: each policy's megatron_modules)
              **{name: [("--recompute-granularity", "selective"),
                        ("--recompute-modules", policy_class(name).megatron_modules)]
                 for name in ("recompute_norm_act", "recompute_moe", "recompute_mlp")},
              # chosen modules' saved tensors on the host (`memo_sim.policy.offload_modules`: each policy's modules),
              # beside the modules it re-runs where it re-runs some (its megatron_modules)
              **{name: ([("--recompute-granularity", "selective"),
                         ("--recompute-modules", policy_class(name).megatron_modules)]
                        if getattr(policy_class(name), "megatron_modules", ()) else [])
                 + [("--fine-grained-activation-offloading", None),
                    ("--offload-modules", policy_class(name).offload_modules)]
                 for name in ("offload_attn", "offload_attn_experts", "offload_attn_experts_recompute")}}
_RUNS = {name: " ".join(o if v is None else f"{o} {v if isinstance(v, str) else ' '.join(v)}" for o, v in args) or
         "no recompute (every activation kept)" for name, args in _RECOMPUTE.items()}


# Megatron-LM's activation offload at d98e8a64: --cpu-offloading-num-layers N (a ModelParallelConfig field through
# ArgumentGroupFactory) turns cpu_offloading on (validate_args: `if args.cpu_offloading_num_layers > 0:
# args.cpu_offloading = True`); cpu_offloading itself is excluded from the generated options (arguments.py's list of
# TransformerConfig fields with no CLI argument), so there is no --cpu-offloading (a review found the note naming it).
# TransformerConfig refuses it beside pipeline stages or activation recompute. d98e8a64 also offloads chosen modules'
# inputs (--fine-grained-activation-offloading --offload-modules ... --activation-offload-fraction: TransformerConfig
# fine_grained_activation_offloading, transformer_config.py:1323-1361), which memo prices for three module sets (the
# policies offload_attn, offload_attn_experts and offload_attn_experts_recompute, written as such above; a review: the
# note named the layer-level offload alone)
_OFFLOAD_NOTE = ("Megatron's activation offload moves whole layers' activations (--cpu-offloading-num-layers N, "
                 "without pipeline stages or recompute only) or chosen modules' saved tensors (--fine-grained-"
                 "activation-offloading --offload-modules ...: memo's offload_attn, offload_attn_experts and "
                 "offload_attn_experts_recompute policies), "
                 "not a fraction of each layer's token rows; memo does not price the layer-level one, so it is not "
                 "written")


def gaps(plan: Plan) -> list[Gap]:
    """Megatron-LM interleaves pipelines itself, so only Ulysses, METP, ZeRO 2 and the
    policies other than store-all and full recompute are gaps (and GPT-OSS's attention, which
    the script leaves to the user)."""
    uly = _ulysses_gaps(plan)
    return (uly + _window_cp_gaps(plan, uly) + metp_gap(plan)
            + async_tp_gap(plan, "Megatron TP with sequence parallelism, its collectives on the critical path "
                                 "(--tp-comm-overlap, TransformerEngine's userbuffer overlap, is not priced by memo)")
            + zero_gap(plan, (0, 1, 3), "--use-distributed-optimizer, or Megatron-FSDP for ZeRO 3 (its optim_grads "
                                        "strategy, ZeRO 2's sharding, memo's megatron data does not price)")
            + dp_flavour_gap(plan, FRAMEWORK) + balance_gap(plan, FRAMEWORK)
            + policy_gaps(plan, _RUNS, notes={"memo": _OFFLOAD_NOTE, "full_offload": _OFFLOAD_NOTE})
            + gemm_format_gap(plan, "megatron") + optimizer_offload_gap(plan, "megatron") + _attention_gaps(plan)
            + _router_gaps(plan.model) + not_modelled_gap(plan) + alloc_gap(plan))


def _ulysses_gaps(plan: Plan) -> list[Gap]:
    """Ulysses is TransformerEngine's all-to-all context parallelism (--cp-comm-type a2a, or a2a+p2p beside a
    ring): expressed where each TP rank's K/V heads split whole over it (the framework data's ulysses_kv
    whole); a plan that repeats K/V heads first (memo's own Ulysses) is the usual gap, ring CP instead."""
    lay, m = plan.layout, plan.model
    why = None if lay.ulysses == 1 else kv_heads_why_not(lay.tp, lay.ulysses, m.n_kv_heads, "whole")
    if why is None:
        return []
    return ulysses_gap(plan, why=why)  # the reason beside it (a review: the ring read as Megatron having no a2a CP)


def _window_cp_gaps(plan: Plan, earlier: list[Gap]) -> list[Gap]:
    """Ring CP beside a sliding window, which TransformerEngine refuses: attn_forward_func_with_cp
    (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py) asserts ``not
    sliding_window_attn or cp_comm_type in ["a2a", "all_gather"]`` ("The context parallel running configs cannot
    support sliding window attetnion!"), and Megatron-LM's p2p default (megatron/core/extensions/transformer_engine.py
    :2063 at d98e8a64) and a2a+p2p are neither (the framework data's ``ring_cp_sliding_window``). The nearest: the
    whole CP group as the all-to-all (--cp-comm-type a2a) where its heads split over it (memo's Ulysses), else the
    ring's ranks data-parallel replicas where the replica's sequences split over them (the global batch kept), else
    the export is refused in one line (a review: --window-size written beside a p2p ring of 2). ``earlier``: the
    Ulysses gaps (a Ulysses memo repeats K/V for, written as a ring)."""
    lay = nearest_plan(plan, earlier)[0]
    if not plan.model.sliding_layers or lay.cp == 1:
        return []
    what = (f"ring context parallelism over {lay.cp} GPUs" + (f" beside Ulysses over {lay.ulysses}" if lay.ulysses > 1
                                                              else "")
            + f" with a {plan.model.sliding_window}-token sliding window")
    te = ("TransformerEngine's CP runs a sliding window under --cp-comm-type a2a or all_gather only, "
          "Megatron's default p2p ring and a2a+p2p assert")
    total, m = lay.cp * lay.ulysses, plan.model
    a2a = replace(lay, cp=1, ulysses=total)
    a2a_why = _why_not(plan, a2a, plan.batch)
    change = PlanChange(layout={"cp": 1, "ulysses": total})
    if a2a_why is None:
        return [Gap(what, f"TransformerEngine's all-to-all CP over {total} GPUs (--cp-comm-type a2a): {te}", change)]
    batch = plan.batch // lay.cp
    replicas = replace(lay, cp=1, dp=lay.dp * lay.cp)
    if plan.batch % lay.cp == 0 and batch % plan.micro_batch == 0 and _why_not(plan, replicas, batch) is None:
        return [Gap(what, f"no ring: its {lay.cp} ranks data-parallel replicas (dp {replicas.dp}, {batch} "
                          f"sequence{'s' if batch != 1 else ''} per replica: the global batch of "
                          f"{plan.batch * lay.dp} kept), memo not running an all-to-all of {total} ({a2a_why}): {te}",
                    PlanChange(layout={"cp": 1, "dp": replicas.dp}, batch=batch))]
    if m.heads % (lay.tp * total) == 0 and kv_heads_why_not(lay.tp, total, m.n_kv_heads, "whole") is None:
        # TransformerEngine runs it (the heads split whole over the all-to-all), memo does not price it
        return [Gap(what, f"TransformerEngine's all-to-all CP over {total} GPUs (--cp-comm-type a2a), which memo "
                          f"cannot price ({a2a_why}): {te}", change)]
    raise NoNearest(f"--to megatron: {what} cannot run ({te}); an all-to-all CP of {total} GPUs does not split the "
                    f"model's heads, and the ring's ranks as replicas cannot run ({a2a_why}); export a plan without "
                    f"ring CP (memo-sim whatif --framework megatron offers none for this model) or to another "
                    f"framework")


def _why_not(plan: Plan, lay, batch: int) -> str | None:
    """Why memo does not run ``lay`` for the plan's model as Megatron-LM runs it (its mechanisms: `Framework.adapt`,
    the K/V heads split whole over the all-to-all among them), else None."""
    one = get_framework(FRAMEWORK).adapt(lay)
    return check_layout(one, plan.model, one.gpus, max(one.gpus, 1), plan.seq_tokens, batch)


def _window_pattern(m) -> list[tuple[str, str]]:
    """A sliding window as Megatron-Core runs it (TransformerConfig.window_size, (left, right) with the query's own
    token counted: W - 1 to its left), on every layer, or on the layers of the model's pattern (``sliding_period`` N:
    --window-attn-skip-freq N, N - 1 sliding layers then a full one, as examples/gptoss/02_train.sh writes GPT-OSS's);
    [] where the model does not place its sliding layers."""
    if not m.sliding_layers or (m.sliding_layers < m.layers and not m.sliding_period):
        return []
    out = [("--window-size", f"{m.sliding_window - 1},0")]
    if m.sliding_layers < m.layers:
        out.append(("--window-attn-skip-freq", str(m.sliding_period)))
    return out


def _attention_only_bias(m) -> bool:
    """Biases on the attention's projections alone (a SwiGLU model's attention_bias: Qwen3's, Llama's), which
    Megatron's all-or-none linear biases cannot write; a MoE model whose experts (and router) carry biases too
    (GPT-OSS: ``moe_bias``) has them on every linear layer, as Megatron's --add-bias-linear default puts them
    (its router's gate included: megatron/core/transformer/moe/router.py)."""
    return m.bias == "all" and m.ffn_type == "swiglu" and not (m.moe and m.moe_bias)


def _attention_gaps(plan: Plan) -> list[Gap]:
    """Attention the script does not write: a sliding window on some layers (GPT-OSS); Megatron-Core has
    --window-size and --window-attn-skip-freq, the per-layer pattern is the user's to set. The numerics:
    an output-projection bias without MLP biases, the rotary scaling, an unstated rotary base."""
    m, out = plan.model, []
    if _attention_only_bias(m):
        out.append(Gap("the attention output projection's bias (q, k, v and o biases without MLP biases)",
                       "q, k, v biases alone (--disable-bias-linear --add-qkv-bias): Megatron's linear biases "
                       "would put biases on the MLP too"))
    if (m.rope_scaling and llama3_rope_factor(m.rope_scaling) is None
            and not mla_yarn_arguments(m)):
        yarn = m.rope_scaling.startswith("yarn")
        out.append(Gap(f"the rotary embedding's scaling ({m.rope_scaling})",
                       "unscaled rotary embeddings: set Megatron's " + (
                           "YaRN options (--rope-type yarn with --rotary-scaling-factor, --mscale and --mscale-all-dim "
                           "under MLA; else --position-embedding-type yarn with its --yarn-* options)" if yarn else
                           "rope scaling options") + " from the model's config by hand"))
    if m.norm == "rmsnorm" and not m.rope_theta:
        out.append(Gap("the rotary base (the model does not state it)",
                       "Megatron's default --rotary-base 10000: set the model's own"))
    if m.chunked_layers:  # arguments.py at d98e8a64 has --no-rope-freq, no chunked attention
        out.append(Gap(f"chunked attention ({m.attention_chunk}-token chunks on {m.chunked_layers} of {m.layers} "
                       f"layers)", "full causal attention on every layer: Megatron-LM has no chunked attention"))
    if m.moe and m.moe_router.weights_input and m.top_k > 1:  # experts.py asserts moe_router_topk 1 under the flag
        out.append(Gap(f"the router's weight on the experts' input ({m.router}, top-{m.top_k})",
                       "the weights on the experts' output, normalised: Megatron-LM's --moe-apply-probs-on-input "
                       "runs top-1 only"))
    if m.sliding_layers and not _window_pattern(m):  # how many layers slide, not which: the pattern is the user's
        out.append(Gap(f"a {m.sliding_window}-token sliding window on {m.sliding_layers} of {m.layers} layers",
                       f"full causal attention on every layer: add --window-size {m.sliding_window - 1},0 and the "
                       "model's layer pattern as --window-attn-skip-freq by hand"))
    return out


def pre_softmax(m) -> bool:
    """Whether the script writes --moe-router-pre-softmax (TransformerConfig.moe_router_pre_softmax at `SOURCE`: the
    softmax over every expert, then top-k, the chosen probabilities as they are; without it top-k of the logits,
    then a softmax over the k: the weights renormalised): softmax routing whose weights are not renormalised
    (``weights_normalised`` False, norm_topk_prob false: DeepSeek-V2's, Qwen2-MoE's), and softmax top-1, which
    TransformerConfig refuses without it (a softmax over one logit has no gradient; `_router_gaps` names the weight
    it gives)."""
    return m.moe and m.moe_router.score_function == "softmax" and (not m.weights_normalised or m.top_k == 1)


def _router_gaps(m) -> list[Gap]:
    """The chosen routing weights Megatron-Core computes otherwise than the model (topk_routing_with_score_function,
    megatron/core/transformer/moe/moe_utils.py at `SOURCE`): softmax top-1 renormalised (a weight of 1) runs only
    under --moe-router-pre-softmax, its weight the probability; a sigmoid router's weights are renormalised exactly
    where top-k is above 1, whatever the model says (--moe-router-pre-softmax changes nothing there). Llama 4's
    weight on the input above top-1 is `_attention_gaps`'s."""
    if not m.moe or (m.moe_router.weights_input and m.top_k > 1):
        return []
    norm, k, fn = m.weights_normalised, m.top_k, m.moe_router.score_function
    if fn == "softmax" and k == 1 and norm:
        return [Gap("the router's top-1 weight renormalised to 1", "the chosen expert's softmax probability over "
                    "every expert (--moe-router-pre-softmax: Megatron-Core refuses softmax top-1 without it)")]
    if fn == "sigmoid" and norm != (k > 1):
        if k > 1:
            return [Gap(f"the router's top-{k} sigmoid weights not renormalised (norm_topk_prob false)",
                        "renormalised to sum to 1: Megatron-Core's sigmoid router renormalises every top-k above 1")]
        return [Gap("the router's top-1 sigmoid weight renormalised to 1", "the sigmoid of the chosen expert's logit: "
                    "Megatron-Core's sigmoid router renormalises only a top-k above 1")]
    return []


# how memo's router and balance names read as Megatron-Core options
# (forced, equal counts, has no option: `balance_gap`; --moe-router-force-load-balancing draws random logits)
_BALANCE = {"random": [("--moe-router-force-load-balancing", None)], "dropless": [], "measured": []}


# MLATransformerConfig's YaRN parameters that Megatron-LM's command line does not set (transformer_config.py at
# d98e8a64: original_max_position_embeddings 4096, beta_fast 32, beta_slow 1); --rotary-scaling-factor, --mscale
# and --mscale-all-dim set the others (arguments.py, their defaults 1.0, 1.0 and 0.0)
MLA_YARN_FIXED = {"original_max_position_embeddings": 4096.0, "beta_fast": 32.0, "beta_slow": 1.0}


def mla_yarn_arguments(m) -> list[tuple[str, str]]:
    """A latent-attention model's YaRN scaling as Megatron-LM's MLA options (DeepSeek-V3's: factor 40, mscale and
    mscale_all_dim 1; examples/ of Megatron-LM pass the same), or [] where the model's scaling is not YaRN or sets a
    parameter the command line cannot (a gap then, `_attention_gaps`)."""
    y = yarn_params(m.rope_scaling) if m.mla else None
    if y is None or any(y.get(k, v) != v for k, v in MLA_YARN_FIXED.items()) or not set(y) <= {"factor",
                                                                                                  *YARN_PARAMS}:
        return []  # a parameter of no option (YaRN's attention_factor, truncate, ...): the gap names it
    return [("--rope-type", "yarn"), ("--rotary-scaling-factor", f"{y['factor']:g}"),
            ("--mscale", f"{y.get('mscale', 1.0):g}"), ("--mscale-all-dim", f"{y.get('mscale_all_dim', 0.0):g}")]


def every_nth(layers: int, n: int) -> str:
    """1 on every ``n``-th of ``layers`` layers, 0 on the others, as the Python list expression Megatron-LM's
    layer patterns evaluate (arguments.py's _eval_pattern: digits, brackets, parentheses, + and * only)."""
    whole, rest = divmod(layers, n)
    return f"([0]*{n - 1}+[1]*1)*{whole}" + (f"+[0]*{rest}" if rest else "")


def moe_layer_pattern(m) -> str:
    """Where a MoE model's dense layers lie (`ModelConfig.dense_layer_at`), as --moe-layer-freq's list
    expression: 0 a dense layer, 1 a MoE layer, e.g. DeepSeek-V3's ``([0]*3+[1]*58)``, Llama 4 Maverick's
    ``([0]*1+[1]*1)*24``."""
    if m.dense_period:
        return every_nth(m.layers, m.dense_period)
    return f"([0]*{m.dense_layers}+[1]*{m.moe_layers})"


def moe_arguments(plan: Plan, lay) -> list[tuple[str, str | None]]:
    """The mixture-of-experts and latent-attention options of a plan (none for a dense model)."""
    m, args = plan.model, []
    if m.mla:
        args += [("--multi-latent-attention", None), ("--kv-lora-rank", str(m.kv_lora_rank)),
                 ("--qk-head-dim", str(m.head_dim)), ("--qk-pos-emb-head-dim", str(m.qk_rope_dim)),
                 ("--v-head-dim", str(m.value_head_dim))]
        if m.q_lora_rank:
            args.append(("--q-lora-rank", str(m.q_lora_rank)))
    elif m.head_dim:
        args.append(("--kv-channels", str(m.head_dim)))
    if m.qk_norm or m.mla:  # under MLA the option is the latent RMSNorms (DeepSeek's q_a / kv_a_layernorm):
        args.append(("--qk-layernorm", None))  # gpt_layer_specs.py fuses them into the up-projections only with it
    if not m.moe:
        return args
    args += [("--num-experts", str(m.experts)), ("--moe-router-topk", str(m.top_k)),
             ("--moe-ffn-hidden-size", str(m.expert_width))]
    if m.dense_layers:  # Megatron-Core's layer pattern, 0 dense and 1 MoE (arguments.py's moe_freq_type)
        args.append(("--moe-layer-freq", moe_layer_pattern(m)))
    if m.shared_experts:
        args.append(("--moe-shared-expert-intermediate-size", str(m.shared_width)))
        if m.shared_gate:
            args.append(("--moe-shared-expert-gate", None))
    r = m.moe_router
    if r.score_function != "softmax":  # DeepSeek-V3's and GLM's with a bias per expert (auxiliary-loss-free), Llama 4's
        args.append(("--moe-router-score-function", r.score_function))
        if r.expert_bias:
            args.append(("--moe-router-enable-expert-bias", None))
    if pre_softmax(m):  # the chosen weights the softmax over every expert, not renormalised (DeepSeek-V2, Qwen2-MoE)
        args.append(("--moe-router-pre-softmax", None))
    # the balance loss beside it: per sequence (DeepSeek's seq_aux) or per micro-batch (GShard's); a router balanced
    # by its expert bias without a coefficient has none
    balance = "seq_aux_loss" if m.seq_aux else "aux_loss" if not r.expert_bias or m.aux_loss_coef else "none"
    args.append(("--moe-router-load-balancing-type", balance))
    if balance != "none" and m.aux_loss_coef:  # Megatron's default coefficient is 0: the loss would weigh nothing
        args.append(("--moe-aux-loss-coeff", f"{m.aux_loss_coef:g}"))
    if m.router_groups:  # group-limited routing (TransformerConfig's moe_router_num_groups / moe_router_group_topk)
        args += [("--moe-router-num-groups", str(m.router_groups)),
                 ("--moe-router-group-topk", str(m.router_group_topk))]
    if m.router_scaling != 1.0:
        args.append(("--moe-router-topk-scaling-factor", repr(m.router_scaling)))
    if r.weights_input and m.top_k == 1:  # Llama 4's weight on the expert's input (Megatron-Core asserts top-1)
        args.append(("--moe-apply-probs-on-input", None))
    args += [("--expert-model-parallel-size", str(lay.ep)), ("--expert-tensor-parallel-size", str(lay.etp)),
             ("--moe-token-dispatcher-type", lay.dispatcher.megatron), ("--moe-grouped-gemm", None)]
    if lay.dispatcher.megatron_backend:
        args.append(("--moe-flex-dispatcher-backend", lay.dispatcher.megatron_backend))
    if lay.ep_overlap:  # the merged forward-backward steps, the weight gradients after the dispatch's backward
        args += [("--overlap-moe-expert-parallel-comm", None), ("--delay-wgrad-compute", None)]
    bal = lay.balance
    if bal.kind == "capacity":
        args += [("--moe-expert-capacity-factor", f"{bal.capacity:g}"), ("--moe-pad-expert-input-to-capacity", None)]
    else:
        args += _BALANCE[bal.kind]
    return args


# the GEMM formats as --fp8-recipe values (megatron/training/arguments.py, _add_transformer_engine_args)
FP8_RECIPES = {"fp8-tensorwise": "tensorwise", "fp8-blockwise": "blockwise", "mxfp8": "mxfp8"}
# and their --fp8-format, as memo prices each (`memo_sim.model.gemm_formats`): tensorwise current scaling in "hybrid"
# (E4M3 in forward, E5M2 for gradients: TransformerEngine's Float8CurrentScaling default), the block-scaled recipes
# in E4M3 everywhere (TransformerEngine's Float8BlockScaling and MXFP8BlockScaling default to Format.E4M3, and
# Megatron-LM's docs write --fp8-format e4m3 beside --fp8-recipe blockwise / mxfp8); a review found hybrid written
# for all three (memo's fp8-rowwise, torchao's recipe, is not a Megatron one)
FP8_FORMATS = {"fp8-tensorwise": "hybrid", "fp8-blockwise": "e4m3", "mxfp8": "e4m3"}
# the 4-bit formats as --fp4-recipe values (TransformerConfig's fp4_recipe at d98e8a64, with fp4 = --fp4-format e2m1;
# Megatron refuses --fp4-format beside --fp8-format)
FP4_RECIPES = {"nvfp4": "nvfp4"}


def _words(val: str | tuple[str, ...] | None) -> str:
    """An option's value as the script writes it: none (a flag), one word, or a list (nargs '+')."""
    if val is None:
        return ""
    return " " + " ".join(shlex.quote(v) for v in ((val,) if isinstance(val, str) else val))


# the attention kernel a plan is priced on as TransformerConfig's attention_backend (AttnBackend, an option through
# ArgumentGroupFactory: --attention-backend flash|fused|unfused|local|auto); Megatron's default auto lets
# TransformerEngine choose, which need not be the kernel memo priced
ATTENTION_BACKENDS = {"cudnn": "fused", "flash": "flash", "materialised": "unfused"}


def rotary_arguments(m) -> list[tuple[str, str | None]]:
    """The rotary embedding of a model with rotary positions (``ModelConfig.positions``: GPT-NeoX's rotary, memo's GPT
    presets too), written as such whatever the norm; a review found LayerNorm models left on Megatron's default
    --position-embedding-type learned_absolute (megatron/training/arguments.py at d98e8a64, line 2397), an unpriced
    table of --max-position-embeddings rows. A model with learned positions (GPT-2's) gets that default, written.
    --rotary-percent (line 2420, GPTModel's rotary_percent in megatron/core/models/gpt/gpt_model.py line 186) writes a
    partial rotary: GLM-4.5's 0.5, GPT-NeoX's rotary_pct."""
    if m.positions == "learned":  # a position table: Megatron-LM's default, written so (the model's positions)
        return [("--position-embedding-type", "learned_absolute")]
    args: list[tuple[str, str | None]] = [("--position-embedding-type", "rope")]
    if m.rope_theta:  # the config's rotary base (Megatron's default is 10000; Llama-3.1 500000, Qwen3 1e6)
        args.append(("--rotary-base", f"{m.rope_theta:.0f}"))
    if (factor := llama3_rope_factor(m.rope_scaling)) is not None:  # Llama 3.x's, with Meta's parameters
        args += [("--use-rope-scaling", None), ("--rope-scaling-factor", f"{factor:g}")]
    args += mla_yarn_arguments(m)  # DeepSeek's YaRN under latent attention
    if m.rotary_fraction:  # GLM-4.5's and GPT-NeoX's partial rotary
        args.append(("--rotary-percent", f"{m.rotary_fraction:g}"))
    if m.nope_period:  # Llama 4's NoPE layers; an integer N needs layers divisible by N (transformer_config.py)
        n = m.nope_period
        args.append(("--no-rope-freq", str(n) if m.layers % n == 0 else every_nth(m.layers, n)))
    return args


def arguments(plan: Plan, applied: list[Gap]) -> list[tuple[str, str | tuple[str, ...] | None]]:
    """(option, value: one word, a tuple of words for a list option, or None for a flag) in the order a
    reader looks for them."""
    m = plan.model
    lay, pol, _ = nearest_plan(plan, applied)
    args = shape_arguments(plan) + [("--vocab-size", str(m.vocab))]
    if m.n_kv_heads != m.heads and not m.mla:
        args += [("--group-query-attention", None), ("--num-query-groups", str(m.n_kv_heads))]
    if m.swiglu_limit:  # GPT-OSS's (examples/gptoss/02_train.sh at SOURCE): quick_gelu(gate) * (up + 1), clamped
        args += [("--quick-geglu", None), ("--glu-linear-offset", "1.0"),
                 ("--activation-func-clamp-value", f"{m.swiglu_limit:g}")]
    elif m.ffn_type == "swiglu":
        args.append(("--swiglu", None))
    if m.norm == "rmsnorm":
        args.append(("--normalization", "RMSNorm"))
    args += rotary_arguments(m)
    if m.norm_eps:
        args.append(("--norm-epsilon", f"{m.norm_eps:g}"))
    # Megatron's linear biases are all or none (with --add-qkv-bias for q, k, v alone): a SwiGLU model's "all" (its
    # q, k, v and output projections: Qwen3's and Llama's attention_bias) is written as q, k, v biases, a gap
    attention_bias = _attention_only_bias(m)
    if m.bias != "all" or attention_bias:
        args.append(("--disable-bias-linear", None))
    if m.bias == "qkv" or attention_bias:
        args.append(("--add-qkv-bias", None))
    if m.attention_sinks:  # one learned logit per head in each softmax (GPT-OSS)
        args.append(("--softmax-type", "learnable"))
    args += _window_pattern(m)
    # the kernel the nearest plan is priced on: the layout as Megatron-LM runs it (`Framework.adapt`, as
    # `price_nearest` adapts it: TransformerEngine's cuDNN attention), its ring's blocks where it runs as blocks
    # (TransformerEngine's CP steps run the backend chosen), cuDNN as FlashAttention where the profile prices it so
    # (a review: a torchtitan plan's flash written beside a nearest plan priced on cuDNN)
    kernel = plan.priced_attention_kernel(get_framework(FRAMEWORK).adapt(lay).attention_kernel())
    if kernel in ATTENTION_BACKENDS:
        args.append(("--attention-backend", ATTENTION_BACKENDS[kernel]))
    if m.mtp_layers:  # on the last pipeline stage without a layout, as memo prices them (a layout writes them: 'm')
        args.append(("--mtp-num-layers", str(m.mtp_layers)))
    if not m.tied_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    if m.dtype in ("bf16", "fp16"):
        args.append((f"--{m.dtype}", None))
    # the format the nearest plan is priced in: a format Megatron-LM lacks replaced by its nearest (`gemm_format_gap`;
    # a review: an fp8-rowwise plan priced as fp8-tensorwise was written with no --fp8-* option, so trained in bf16)
    fmt = nearest_model(plan, applied).gemm_format
    if fmt in FP8_RECIPES:
        args += [("--fp8-format", FP8_FORMATS[fmt]), ("--fp8-recipe", FP8_RECIPES[fmt])]
    elif fmt in FP4_RECIPES:
        args += [("--fp4-format", "e2m1"), ("--fp4-recipe", FP4_RECIPES[fmt])]
    args += moe_arguments(plan, lay)
    args.append(("--tensor-model-parallel-size", str(lay.tp)))
    if lay.tp > 1 and lay.sp:
        args.append(("--sequence-parallel", None))
    if lay.cp * lay.ulysses > 1:  # Megatron's CP group holds the Ulysses ranks (inner) and the ring's
        args.append(("--context-parallel-size", str(lay.cp * lay.ulysses)))
    if lay.ulysses > 1:  # TransformerEngine's all-to-all over the Ulysses ranks, adjacent, a P2P ring across them
        args += ([("--cp-comm-type", "a2a+p2p"), ("--hierarchical-context-parallel-sizes", (str(lay.ulysses),
                                                                                         str(lay.cp)))]
                 if lay.cp > 1 else [("--cp-comm-type", "a2a")])
    if lay.pp > 1:
        args.append(("--pipeline-model-parallel-size", str(lay.pp)))
        if lay.chunk_layers:  # every chunk's layers; Megatron takes the chunks per rank from it (and refuses both)
            args.append(("--pipeline-model-parallel-layout", format_layout(lay.chunk_layers, m.mtp_layers)))
        elif lay.vpp > 1:
            args.append(("--num-virtual-stages-per-pipeline-rank", str(lay.vpp)))
        if lay.first_stage_layers:
            args.append(("--decoder-first-pipeline-num-layers", str(lay.first_stage_layers)))
        if lay.last_stage_layers:
            args.append(("--decoder-last-pipeline-num-layers", str(lay.last_stage_layers)))
        if lay.account_embedding_loss:
            args += [("--account-for-embedding-in-pipeline-split", None),
                     ("--account-for-loss-in-pipeline-split", None)]
    if lay.rank_order in RANK_ORDER_OPTION:  # data parallelism outermost (`memo_sim.layout.rank_order`)
        args.append((RANK_ORDER_OPTION[lay.rank_order], None))
    # the replica's sequences the nearest plan is priced with (`nearest_batch`), as the other exports write them
    args += [("--micro-batch-size", str(plan.micro_batch)),
             ("--global-batch-size", str(nearest_batch(plan, applied) * lay.dp))]
    if lay.zero >= 1 or lay.optimizer_offload:  # the CPU offload runs inside the distributed optimizer
        args.append(("--use-distributed-optimizer", None))  # Megatron-FSDP (v1) runs inside it too
    if lay.zero == 3:  # Megatron-FSDP: weights, gradients and optimizer states sharded (the framework data's sources)
        args += [("--use-megatron-fsdp", None), ("--data-parallel-sharding-strategy", "optim_grads_params"),
                 ("--ckpt-format", "fsdp_dtensor")]
    if lay.optimizer_offload:  # Megatron-Core's HybridDeviceOptimizer, the whole shard on the host
        args += [("--optimizer-cpu-offload", None), ("--use-precision-aware-optimizer", None)]
    if (lay.dp > 1 or lay.cp * lay.ulysses > 1) and _grad_overlap(plan, applied):
        args.append(("--overlap-grad-reduce", None))
        if lay.zero >= 1:
            args.append(("--overlap-param-gather", None))
    return args + _RECOMPUTE[pol.name]  # a policy Megatron-LM does not run is a gap: full recompute instead


# the launch settings the script writes as the plan has them where it was searched for Megatron-LM (`kept_launch`):
# --overlap-grad-reduce, off in Megatron-LM's own arguments (megatron/training/arguments.py at d98e8a64), so a plan
# without it is written without it
KEPT_LAUNCH = ("grad_overlap",)


def _kept(plan: Plan, applied: list[Gap]) -> dict:
    return kept_launch(plan, applied, FRAMEWORK, KEPT_LAUNCH)


def _grad_overlap(plan: Plan, applied: list[Gap]) -> bool:
    """Whether the script overlaps the gradient reduction (--overlap-grad-reduce, with --overlap-param-gather under the
    distributed optimizer): the plan's where it was searched for Megatron-LM, else the framework data's, as the
    nearest plan is priced (`price_nearest` with `_kept`)."""
    return _kept(plan, applied).get("grad_overlap", get_framework(FRAMEWORK).adapt(nearest_plan(plan, applied)[0])
                                    .grad_overlap)


def _plan_header(plan: Plan, applied: list[Gap]) -> list[str]:
    """The script's '# the plan:' line, memo's plan as it was searched, and where the gaps change it (--nearest)
    a '# written:' line of the nearest plan the options below set (a review: the header named the plan's layout
    above a script of another)."""
    lay, pol, schedule = nearest_plan(plan, applied)
    batch = nearest_batch(plan, applied)
    fmt = nearest_model(plan, applied).gemm_format
    seqs = f"{batch} sequence{'s' if batch != 1 else ''} per replica"
    out = [f"# the plan: {plan.model.name}, {plan.seq_tokens} tokens x {plan.batch} "
           f"sequence{'s' if plan.batch != 1 else ''} per replica, "
           f"{plan.layout.label()}, {plan.policy.label()}, schedule {plan.schedule}, {plan.model.gemm_format} GEMMs"]
    if (lay, pol.label(), schedule, batch, fmt) != (plan.layout, plan.policy.label(), plan.schedule, plan.batch,
                                                    plan.model.gemm_format):
        out.append(f"# written (the nearest Megatron-LM runs, gaps above): {seqs}, {lay.label()}, {pol.label()}, "
                   f"schedule {schedule}, {fmt} GEMMs")
    return out


def export(plan: Plan, price: bool = True, instead: dict | None = None) -> Export:
    g = gaps(plan)
    ex = Export("Megatron-LM", SOURCE, {}, g, "")
    ex.instead = instead
    ex.nearest = price_nearest(plan, g, FRAMEWORK, kept=_kept(plan, g)) if price else None
    args = arguments(plan, g)
    tr = torchrun_line(plan, "pretrain_gpt.py")
    lines = ["#!/usr/bin/env bash", ex.comment_block(), "#",
             *_plan_header(plan, g),
             "# Add your data, tokenizer, optimizer and checkpoint arguments (--data-path, --tokenizer-type, "
             "--lr ...).",
             "set -euo pipefail",
             # Megatron-FSDP asserts the variable is unset or above 1 (validate_args at SOURCE); TP's overlap wants 1
             "unset CUDA_DEVICE_MAX_CONNECTIONS" if ("--use-megatron-fsdp", None) in args
             # the EP overlap's two streams (validate_args at SOURCE warns that it wants more than TP's 1 and names
             # 32; the Model Zoo's A2A_OVERLAP runs set 32)
             else "export CUDA_DEVICE_MAX_CONNECTIONS=32" if ("--overlap-moe-expert-parallel-comm", None) in args
             else "export CUDA_DEVICE_MAX_CONNECTIONS=1",
             # validate_args at SOURCE asserts it beside --fine-grained-activation-offloading on TransformerEngine
             # >= 2.10 ("to avoid offloading weights"; a review found the script refused)
             *(["export NVTE_CPU_OFFLOAD_V1=1"] if ("--fine-grained-activation-offloading", None) in args else []),
             alloc_env(nearest_plan(plan, g)[0]) + tr + " \\"]
    body = [f"    {opt}" + _words(val) for opt, val in args]
    lines += [b + " \\" for b in body[:-1]] + [body[-1], ""]
    ex.files[FILE] = "\n".join(lines)
    ex.launch = (f"bash {FILE}  # from a Megatron-LM checkout" + (
        ", on each node with NODE_RANK and MASTER_ADDR set (torchrun's static rendezvous)"
        if "--node-rank" in tr else ""))
    return ex
