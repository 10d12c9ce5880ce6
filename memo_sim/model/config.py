"""Transformer model configurations: the MEMO paper's GPT presets, LLaMA, GPT-175B, today's open
decoder families (Llama-3.1, Qwen2.5, Mistral) and custom ones (flags, memo model files, Hugging
Face ``config.json``: `memo_sim.model.hf_config`).

Architecture fields beyond the shapes, each with the families it describes:

- ``norm``: ``layernorm`` (weight and bias; GPT-2, GPT-NeoX, Megatron GPT) or ``rmsnorm``
  (weight only; Llama, Mistral, Qwen2).
- ``bias``: which linear layers carry a bias. ``all``: the QKV projection, the attention output
  projection and a GELU FFN's two linears (GPT-2, GPT-NeoX, Megatron GPT; a SwiGLU FFN has none,
  as in every family memo models); ``qkv``: only the QKV projection (Qwen2); ``none``: no linear
  layer (Llama, Mistral).
- ``tied_embeddings``: the classifier reuses the token embedding (GPT-2, memo's GPT presets) or
  has its own V x h matrix (Llama-3, Mistral, Qwen2.5 7B and larger).

Attention beyond hidden / heads (each 0 / false by default, so a dense model reads as before):

- ``head_dim``: the query/key head size when it is not hidden / heads (Qwen3, GPT-OSS);
- ``qk_norm``: an RMSNorm over each query and key head (Qwen3);
- ``attention_sinks``: one learned logit per head added to the softmax's denominator (GPT-OSS);
- ``sliding_window`` / ``sliding_layers``: that many layers attend only to the last ``sliding_window``
  tokens (GPT-OSS alternates them with full attention); their attention FLOPs shrink, averaged over
  the layers (`attention_flop_fraction`); ``sliding_period`` N (0: not stated) places them: every N-th layer
  full, the N - 1 before it sliding (GPT-OSS's 2; Megatron-LM's ``--window-attn-skip-freq N``), for the exports;
- ``attention_chunk`` / ``chunked_layers`` / ``chunked_period``: chunked attention (Llama 4's 8192-token chunks on
  three of every four layers, the fourth full and without rotary embedding): a query attends causally to the keys
  of its own chunk only; their attention FLOPs shrink as `attention_flop_fraction` counts them;
- multi-head latent attention (DeepSeek-V2/V3, ``kv_lora_rank`` > 0): queries through a low-rank
  ``q_lora_rank`` projection (0: a direct one), keys and values from a ``kv_lora_rank`` latent plus a
  shared ``qk_rope_dim`` rotary key; query/key heads are ``head_dim`` (the no-rope part) +
  ``qk_rope_dim`` wide, value heads ``v_head_dim``.

Numerics a training script must carry but the simulator does not price (each 0: not stated, the
framework's default; a Hugging Face config gives them, and the exports write them):

- ``rope_theta``: the rotary embedding's base (``rope_theta``: Llama-3.1 500000, Qwen3 1000000);
- ``norm_eps``: the norms' epsilon (``rms_norm_eps``, ``layer_norm_eps``, ``layer_norm_epsilon``);
- ``aux_loss_coef``: a MoE router's load-balancing loss coefficient (``router_aux_loss_coef``,
  DeepSeek's ``aux_loss_alpha``), and ``seq_aux``: whether that loss is taken per sequence (DeepSeek's
  ``seq_aux``; else per micro-batch, GShard's);
- ``rope_scaling``: the rotary embedding's scaling, in words (``rope_scaling``: Llama-3.1's ``llama3``
  factor 8, DeepSeek's ``yarn`` factor 40); the exports name it as not written;
- ``rotary_fraction``: the share of each query/key head the rotary embedding turns (GLM-4.5's
  ``partial_rotary_factor`` 0.5; Megatron-LM's ``--rotary-percent``; 0: all of it);
- ``nope_period`` N: every N-th layer has no rotary embedding (Llama 4's NoPE layers, every fourth;
  Megatron-LM's ``--no-rope-freq N``; 0: rotary on every layer).

How positions enter (``positions``): ``rotary`` (every family memo models from a Hugging Face config but GPT-2; memo's
presets) turns each query and key head by its position in every layer, the op the framework's rotary kernel prices
(`memo_sim.model.rope_kernels`, ``Layout.rope``, over the share of the heads and layers ``rotary_fraction`` and
``nope_period`` leave it);
``learned`` adds a learned position table to the embedding's output once (GPT-2's ``wpe``, Megatron-LM's default
``--position-embedding-type learned_absolute``, which its GPT example scripts keep): no op in the layers, the table
neither counted nor priced.

Mixture of experts (``experts`` > 0; `memo_sim.model.moe_routers` for the router): every layer but
``dense_layers`` of them replaces its FFN with ``experts`` routed experts of width ``expert_ffn``
(SwiGLU or GELU as ``ffn_type``), of which each token uses ``top_k``, beside ``shared_experts``
always-on experts of width ``shared_ffn`` (with a sigmoid gate on their output where
``shared_gate``: Qwen2-MoE) and a gate GEMM (``router``; with ``moe_bias`` the router and the
experts carry biases: GPT-OSS). The ``dense_layers`` (DeepSeek's ``first_k_dense_replace``, Qwen's
``mlp_only_layers`` and ``decoder_sparse_step``) keep an FFN of width ``ffn``: their parameters are
counted exactly, and ``dense_period`` places them (`ModelConfig.dense_layer_at`): 0, the first
``dense_layers`` layers of the model (DeepSeek's ``first_k_dense_replace``); N >= 2, every N-th layer a
MoE layer and the N - 1 before it dense (Llama 4 Maverick's ``interleave_moe_layer_step`` 2, Qwen's
``decoder_sparse_step``). Pipeline stages hold them where they lie
(`memo_sim.cost.sppo.stage_dense_layer_count`), Megatron-Core's --moe-layer-freq is written from them, and
memo-exec builds them there; a Hugging Face config whose dense layers follow neither pattern has that named in
``not_modelled``. The
simulator prices a dense layer's time as a dense layer's in every schedule (`memo_sim.model.layer_kinds`) and every
layer's activations as a MoE layer's (one repeated layer's memory terms; each what-if names it).

The router's chosen weights (``router_normalised``, Hugging Face's ``norm_topk_prob``): True (the default), the k
chosen weights renormalised to sum to 1 (Mixtral, Qwen3-MoE, DeepSeek-V3, GLM-4.5, GPT-OSS; under softmax routing
the same as a softmax over the k chosen logits, Megatron-LM's default); False, each chosen weight the score as the
router gave it (DeepSeek-V2, Qwen1.5-MoE / Qwen2-MoE: the softmax over all the experts, top-k, not renormalised;
Megatron-LM's --moe-router-pre-softmax). A router that never normalises (Llama 4's ``sigmoid_topk``,
`memo_sim.model.moe_routers`) leaves the field unread: `ModelConfig.weights_normalised` is what the executor and
the exports read. The simulator's cost does not change with it: the same gate GEMM, scores and top-k, and the k
chosen weights' division per token inside the router's score pass either way (`Router.score_passes`).

Multi-token prediction (``mtp_layers`` D: DeepSeek-V3's and GLM-4.5's ``num_nextn_predict_layers``, Megatron-LM's
--mtp-num-layers): D modules after the last layer, each predicting one token further. A module is a layer of
the last layer's kind (a MoE layer for DeepSeek-V3, as Megatron-LM builds and its training.py counts it), the
projection of the normed embedding and hidden state (2h -> h) and three norms; the token embedding and the
classifier are the model's, shared (`mtp_params`). ``params()`` leaves them out, as transformers builds no
module (its counts are the tests'); the model states, the optimizer, the gradient reduction and MFU's FLOPs count
them. They run on the last pipeline stage, as Megatron-LM places them without a layout
(`memo_sim.cost.boundary`, `memo_sim.cost.memory.classifier_peak_bytes`).
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from memo_sim.errors import MemoError, validated
from memo_sim.fileio import load_yaml, read_utf8
from memo_sim.model.hf_config import (MAX_MTP_LAYERS, MAX_NOTES, add_note, config_path, hf_model_fields, hf_names_hint,
                                      is_hf_config, language_model, model_name, with_defaults)
from memo_sim.model.gemm_formats import GEMM_FORMATS, GemmFormat, gemm_format
from memo_sim.model.moe_routers import ROUTER_NAMES, Router, router
from memo_sim.model.precision import RECIPES, PrecisionRecipe, default_recipe
from memo_sim.model.router_groups import router_groups_why_not
from memo_sim.units import fmt_params

FFN_TYPES = ("gelu", "swiglu")
DTYPES = ("bf16", "fp16", "fp32")
NORMS = ("layernorm", "rmsnorm")
BIASES = ("all", "qkv", "none")
POSITIONS = ("rotary", "learned")  # `ModelConfig.positions` (module docs)
# Physical caps: the largest published models have ~130 layers, hidden 25K, vocab 256K; a value
# past these is a typo (1e30 layers would hang the simulator), refused with this range.
MAX_LAYERS = 4096
MAX_HIDDEN = 1 << 18
MAX_HEADS = 1 << 12
MAX_FFN = 1 << 20
MAX_VOCAB = 1 << 24
MAX_EXPERTS = 1 << 14
# fields left out of `ModelConfig.to_dict` at these values, so dense models' plans keep their shape
_QUIET_DEFAULTS = {"head_dim": 0, "qk_norm": False, "attention_sinks": False, "sliding_window": 0, "sliding_layers": 0,
                   "sliding_period": 0, "attention_chunk": 0, "chunked_layers": 0, "chunked_period": 0,
                   "q_lora_rank": 0, "kv_lora_rank": 0, "qk_rope_dim": 0, "v_head_dim": 0, "experts": 0, "top_k": 0,
                   "expert_ffn": 0, "shared_experts": 0, "shared_ffn": 0, "shared_gate": False, "dense_layers": 0,
                   "dense_period": 0, "router": "softmax", "moe_bias": False, "router_groups": 0,
                   "router_group_topk": 0, "router_normalised": True,
                   "router_scaling": 1.0, "rope_theta": 0.0, "norm_eps": 0.0, "aux_loss_coef": 0.0,
                   "seq_aux": False, "rope_scaling": "", "rotary_fraction": 0.0, "nope_period": 0,
                   "positions": "rotary", "mtp_layers": 0, "not_modelled": "", "swiglu_limit": 0.0,
                   "fp8_weights_per_use": False, "fp8_weights_saved": False, "fp8_transposes": True,
                   "fp8_attention_copy": True, "fp8_abs_saved": False,
                   "qk_norm_kept": False, "offload_copies_per_group": False}


# the fields a framework's FP8 library sets (`memo_sim.frameworks.Framework.for_model`, `memo_sim.cost.gemm_format.
# for_profile`): they move nothing but a quantised format's pricing (`framework_field_moves`)
FP8_MODEL_FIELDS = ("fp8_saved_inputs", "fp8_sp_gathers", "fp8_weights_per_use", "fp8_weights_saved", "fp8_transposes",
                    "fp8_attention_copy", "fp8_abs_saved")


def framework_field_moves(model: "ModelConfig", name: str, offloads_modules: bool) -> bool:
    """Whether the framework-set model field ``name`` changes what a plan of ``model`` prices: an FP8 library's field
    under a quantised GEMM format only, the fine-grained offload's copies (``offload_copies_per_group``) under a
    policy that offloads module groups only (``offloads_modules``), any other field always. The one rule the export's
    and the what-if's lists of a framework's changes follow (a review: the what-if named the offload's field for a
    store-all plan, the export named neither field)."""
    if name in FP8_MODEL_FIELDS:
        return model.gemm.quantised
    if name == "offload_copies_per_group":
        return offloads_modules
    return True


# the fields that describe a mixture of experts and mean nothing without ``experts`` (module docs): the one list a dense
# model given any of them at other than its default is refused by (`ModelConfig.from_dict`; a review found moe_bias,
# router, shared_gate, router_normalised, aux_loss_coef and seq_aux on a dense model read and silently ignored)
EXPERT_FIELDS = ("top_k", "expert_ffn", "shared_experts", "shared_ffn", "shared_gate", "dense_layers", "dense_period",
                 "router", "moe_bias", "router_groups", "router_group_topk", "router_scaling", "router_normalised",
                 "aux_loss_coef", "seq_aux")


def _dim(hi: int):
    return Annotated[int, Field(strict=True, ge=1, le=hi)]


class _ModelIn(BaseModel):
    """The model fields, validated once (pydantic): whole positive numbers under physical caps,
    names from their enums, then the divisibility the layer's shapes need."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(strict=True, min_length=1)
    layers: _dim(MAX_LAYERS)
    hidden: _dim(MAX_HIDDEN)
    heads: _dim(MAX_HEADS)
    ffn: _dim(MAX_FFN)
    vocab: _dim(MAX_VOCAB) = 50257
    kv_heads: _dim(MAX_HEADS) | None = None
    ffn_type: Literal[FFN_TYPES] = "gelu"
    swiglu_limit: Annotated[float, Field(strict=True, ge=0, le=1e6, allow_inf_nan=False)] = 0.0
    dtype: Literal[DTYPES] = "bf16"
    precision: Literal[tuple(RECIPES)] | None = None
    norm: Literal[NORMS] = "layernorm"
    bias: Literal[BIASES] = "all"
    tied_embeddings: bool = Field(True, strict=True)
    gemm_format: Literal[GEMM_FORMATS] = "bf16"
    fp8_saved_inputs: bool = Field(False, strict=True)
    fp8_sp_gathers: bool = Field(False, strict=True)
    fp8_weights_per_use: bool = Field(False, strict=True)
    fp8_weights_saved: bool = Field(False, strict=True)
    fp8_transposes: bool = Field(True, strict=True)
    fp8_attention_copy: bool = Field(True, strict=True)
    fp8_abs_saved: bool = Field(False, strict=True)
    head_dim: Annotated[int, Field(strict=True, ge=0, le=MAX_HIDDEN)] = 0
    qk_norm: bool = Field(False, strict=True)
    qk_norm_kept: bool = Field(False, strict=True)
    offload_copies_per_group: bool = Field(False, strict=True)
    attention_sinks: bool = Field(False, strict=True)
    sliding_window: Annotated[int, Field(strict=True, ge=0, le=1 << 30)] = 0
    sliding_layers: Annotated[int, Field(strict=True, ge=0, le=MAX_LAYERS)] = 0
    sliding_period: Annotated[int, Field(strict=True, ge=0, le=MAX_LAYERS)] = 0
    attention_chunk: Annotated[int, Field(strict=True, ge=0, le=1 << 30)] = 0
    chunked_layers: Annotated[int, Field(strict=True, ge=0, le=MAX_LAYERS)] = 0
    chunked_period: Annotated[int, Field(strict=True, ge=0, le=MAX_LAYERS)] = 0
    q_lora_rank: Annotated[int, Field(strict=True, ge=0, le=MAX_HIDDEN)] = 0
    kv_lora_rank: Annotated[int, Field(strict=True, ge=0, le=MAX_HIDDEN)] = 0
    qk_rope_dim: Annotated[int, Field(strict=True, ge=0, le=MAX_HIDDEN)] = 0
    v_head_dim: Annotated[int, Field(strict=True, ge=0, le=MAX_HIDDEN)] = 0
    experts: Annotated[int, Field(strict=True, ge=0, le=MAX_EXPERTS)] = 0
    top_k: Annotated[int, Field(strict=True, ge=0, le=MAX_EXPERTS)] = 0
    expert_ffn: Annotated[int, Field(strict=True, ge=0, le=MAX_FFN)] = 0
    shared_experts: Annotated[int, Field(strict=True, ge=0, le=MAX_EXPERTS)] = 0
    shared_ffn: Annotated[int, Field(strict=True, ge=0, le=MAX_FFN)] = 0
    shared_gate: bool = Field(False, strict=True)
    dense_layers: Annotated[int, Field(strict=True, ge=0, le=MAX_LAYERS)] = 0
    dense_period: Annotated[int, Field(strict=True, ge=0, le=MAX_LAYERS)] = 0
    router: Literal[ROUTER_NAMES] = "softmax"
    moe_bias: bool = Field(False, strict=True)
    router_groups: Annotated[int, Field(strict=True, ge=0, le=MAX_EXPERTS)] = 0
    router_group_topk: Annotated[int, Field(strict=True, ge=0, le=MAX_EXPERTS)] = 0
    router_scaling: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] = 1.0
    router_normalised: bool = Field(True, strict=True)
    rope_theta: Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)] = 0.0
    norm_eps: Annotated[float, Field(ge=0, le=1.0, allow_inf_nan=False)] = 0.0
    aux_loss_coef: Annotated[float, Field(ge=0, le=1e3, allow_inf_nan=False)] = 0.0
    seq_aux: bool = Field(False, strict=True)
    rope_scaling: str = Field("", strict=True, max_length=200)
    rotary_fraction: Annotated[float, Field(ge=0, le=1.0, allow_inf_nan=False)] = 0.0
    nope_period: Annotated[int, Field(strict=True, ge=0, le=MAX_LAYERS)] = 0
    positions: Literal[POSITIONS] = "rotary"
    mtp_layers: Annotated[int, Field(strict=True, ge=0, le=MAX_MTP_LAYERS)] = 0
    not_modelled: str = Field("", strict=True, max_length=MAX_NOTES)
    gemm_format_from: str = Field("", strict=True, max_length=1000)

    @model_validator(mode="after")
    def _shapes(self):
        if self.swiglu_limit and self.ffn_type != "swiglu":  # a review: a GELU model's limit was described as priced
            raise ValueError(f"swiglu_limit ({self.swiglu_limit:g}) clamps GPT-OSS's SwiGLU and ffn_type is "
                             f"{self.ffn_type}: give ffn_type swiglu, or leave swiglu_limit out")
        if self.head_dim == 0 and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}); change one of them "
                             f"(or give head_dim)")
        kv = self.kv_heads if self.kv_heads is not None else self.heads
        if self.heads % kv:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({kv}); change one of them")
        if self.experts:
            if not self.top_k:
                raise ValueError(f"top_k is missing: give the experts each token is routed to (1 to the "
                                 f"{self.experts} experts)")
            if not 1 <= self.top_k <= self.experts:
                raise ValueError(f"top_k ({self.top_k}) must be between 1 and the {self.experts} experts; change top_k")
            if self.dense_layers >= self.layers:
                raise ValueError(f"dense_layers ({self.dense_layers}) leaves no MoE layer of the {self.layers}; "
                                 f"give fewer dense layers or no experts")
            why = router_groups_why_not(self.experts, self.top_k, self.router_groups, self.router_group_topk)
            if why:
                raise ValueError(why)
            _check_period(self.layers, "dense", self.dense_period, self.dense_layers, full="MoE")
        # a dense model's expert fields (EXPERT_FIELDS) are refused where a file, a plan or flags give them
        # (`ModelConfig.from_dict`): a view built in code may carry them (memo_exec.layer.dense_view)
        if self.sliding_layers > self.layers:
            raise ValueError(f"sliding_layers ({self.sliding_layers}) exceeds the {self.layers} layers")
        if bool(self.sliding_layers) != bool(self.sliding_window):
            raise ValueError("sliding_window and sliding_layers go together: give both or neither")
        _check_period(self.layers, "sliding", self.sliding_period, self.sliding_layers)
        if bool(self.chunked_layers) != bool(self.attention_chunk):
            raise ValueError(f"attention_chunk ({self.attention_chunk}) and chunked_layers ({self.chunked_layers}) go "
                             f"together: give both above 0, or neither")
        if self.chunked_layers + self.sliding_layers > self.layers:
            raise ValueError(f"chunked_layers ({self.chunked_layers}) and sliding_layers ({self.sliding_layers}) "
                             f"exceed the {self.layers} layers")
        _check_period(self.layers, "chunked", self.chunked_period, self.chunked_layers)
        if self.positions == "learned" and (self.rotary_fraction or self.nope_period or self.qk_rope_dim):
            raise ValueError("positions learned (a position table, no rotary embedding) takes no rotary_fraction, "
                             "nope_period or qk_rope_dim; give positions rotary or leave them at 0")
        if self.nope_period == 1 or self.nope_period > self.layers:
            raise ValueError(f"nope_period ({self.nope_period}): every N-th layer without rotary embedding needs N "
                             f"from 2 to the {self.layers} layers; give 0 for rotary on every layer")
        if self.kv_lora_rank:
            if not (self.head_dim and self.qk_rope_dim and self.v_head_dim):
                raise ValueError("multi-head latent attention (kv_lora_rank) needs head_dim (the no-rope query/key "
                                 "head), qk_rope_dim and v_head_dim")
            if self.kv_heads is not None:  # a review: the cost ignored it (`kv_dim`) while the layouts were held to it
                raise ValueError(f"kv_heads ({self.kv_heads}) with kv_lora_rank ({self.kv_lora_rank}): under "
                                 f"multi-head latent attention every head has its own keys and values, up-projected "
                                 f"from the shared latent (DeepSeek-V2/V3's kv_b_proj: kv_lora_rank -> heads x "
                                 f"(head_dim + v_head_dim), `attention_params`); leave kv_heads out")
        elif self.q_lora_rank or self.qk_rope_dim or self.v_head_dim:
            raise ValueError("q_lora_rank, qk_rope_dim and v_head_dim describe latent attention: give kv_lora_rank too")
        return self


def modules_words(n: int, kind: str = "") -> str:
    """``n`` multi-token-prediction modules counted in words: '1 module', '2 modules' (``kind`` before 'module')."""
    return f"{n} {kind + ' ' if kind else ''}module{'s' if n != 1 else ''}"


def period_layers(layers: int, period: int) -> int:
    """The layers of ``kind`` a period N places among ``layers``: all but each N-th (0 where no period)."""
    return layers - layers // period if period else 0


def _check_period(layers: int, kind: str, period: int, count: int, full: str = "full") -> None:
    """A layer pattern (``sliding_period`` / ``chunked_period`` / ``dense_period`` N: every N-th layer ``full``,
    the N - 1 before it of ``kind``) that places the ``count`` layers stated, or a one-line ValueError."""
    placed = period_layers(layers, period)
    if period and (period < 2 or count != placed):
        raise ValueError(f"{kind}_period ({period}): every N-th layer {full}, the N - 1 before it {kind}, gives "
                         f"{placed} {kind} layers of {layers}, not {kind}_layers ({count}); give N >= 2 that "
                         f"matches, or 0")


def _pattern_at(layers: int, i: int, count: int, period: int, value: int) -> int | None:
    """``value`` where layer ``i`` is one of the ``count`` layers a pattern of ``period`` places (every N-th layer
    full, the N - 1 before it of the kind; a multi-token-prediction module's ``layers + k`` as the last layer), 0
    where it is full, None where the pattern is not said (some but not all layers, no period)."""
    if not count:
        return 0
    if count == layers:
        return value
    if not period:
        return None
    return 0 if (min(i, layers - 1) + 1) % period == 0 else value


def _counted(method):
    """A parameter count of the (frozen) model, computed once per model: the search asks for them for
    every candidate."""
    name = method.__name__

    def wrapper(self):
        counts = self._counts
        if name not in counts:
            counts[name] = method(self)
        return counts[name]
    wrapper.__name__, wrapper.__doc__ = name, method.__doc__
    return wrapper


def cache_hash(cls: type) -> type:
    """``cls`` (a frozen dataclass) with its generated hash computed once per object and kept in it: the what-if's
    memos hash a model and a layout (`memo_sim.layout.parallel.Layout`) at every call (tens of fields each: 1.3-1.5 us
    a time, millions of times in a cluster-scale query). The value is the dataclass's own; it is left out of the
    pickled state (a string's hash differs between processes), and `dataclasses.replace` builds a new object, so it
    never outlives the fields it hashes."""
    plain = cls.__hash__

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = plain(self)
        return h

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state

    cls.__hash__, cls.__getstate__ = __hash__, __getstate__
    return cls


@cache_hash
@dataclass(frozen=True)
class ModelConfig:
    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int = 50257
    kv_heads: int | None = None  # grouped-query attention; None = heads
    ffn_type: str = "gelu"  # gelu: fc1 (h->f), act, fc2 (f->h); swiglu: gate+up (h->2f), act, down
    # GPT-OSS's SwiGLU (`swiglu_limit` > 0): gate * sigmoid(1.702 gate) * (up + 1), gate clamped above at the limit and
    # up to [-limit, limit] (transformers' GptOssExperts; Megatron-LM's --quick-geglu --glu-linear-offset 1.0
    # --activation-func-clamp-value); the same GEMMs and elementwise traffic as SwiGLU, priced as it (`model_notes`)
    swiglu_limit: float = 0.0
    dtype: str = "bf16"
    precision: str | None = None  # model-state recipe (`memo_sim.model.precision`); None: by dtype
    norm: str = "layernorm"  # layernorm | rmsnorm (module docs)
    bias: str = "all"  # which linears carry a bias: all | qkv | none (module docs)
    tied_embeddings: bool = True  # the classifier reuses the token embedding
    gemm_format: str = "bf16"  # the layer GEMMs' number format (`memo_sim.model.gemm_formats`)
    # with a quantised format: the GEMM inputs kept for backward are the quantised copies (TransformerEngine),
    # not the high-precision tensors (torchao's Float8Linear); set by the framework (`Framework.for_model`)
    fp8_saved_inputs: bool = False
    # with a quantised format: sequence parallelism's all-gathers of the column-parallel GEMMs' inputs (forward)
    # and of the row-parallel GEMMs' output gradients (backward) carry the quantised copies, cast on the rank's
    # sequence shard before the all-gather (torchao's Float8 TP styles); set by the framework
    fp8_sp_gathers: bool = False
    # with a quantised format: the linear weights are cast at every use (each GEMM's forward, recompute and backward)
    # and no quantised copy is kept (torchao's Float8Linear); else their copies are kept across the step's
    # micro-batches and re-cast once after the optimizer step (TransformerEngine, memo's executor); set by the framework
    fp8_weights_per_use: bool = False
    # with a quantised format: each layer's quantised weight copy is made by its forward and saved by autograd for
    # its backward (torchao eab345c's Float8Linear: ``ctx.save_for_backward(input_fp8, weight_fp8_t)``), so one copy
    # a layer lives as the layer's saved tensors do under the activation policy (`memo_sim.policy.base.Policy
    # .kept_extras`), not as a per-step cache of every layer's (`memo_sim.cost.gemm_format.weight_cache_bytes`);
    # set by the framework
    fp8_weights_saved: bool = False
    # with a format whose second copy is a transpose (``GemmFormat.transposed_copy``): whether the casts write it;
    # False where the GPU's FP8 GEMMs take any layout and the framework keeps one copy (TransformerEngine on
    # Blackwell); set from the framework and the profile together (`memo_sim.cost.gemm_format.for_profile`)
    fp8_transposes: bool = True
    # with a quantised format and the GEMM inputs' copies kept (``fp8_saved_inputs``): whether the output projection
    # keeps its own quantised copy of the attention output beside the kernel's (TransformerEngine's Linear, torchao's
    # Float8Linear); False where it keeps the original and casts it again for the weight gradient (Megatron-LM at
    # d98e8a64: ``set_save_original_input(self.linear_proj)`` for every FP8 recipe but delayed and for FP4 on
    # TransformerEngine >= 2.6, attention.py); set by the framework
    fp8_attention_copy: bool = True
    # with a quantised format under a per-op selective checkpoint (`memo_sim.policy.op_sac`): whether its save list
    # keeps the output of each cast's abs pass (the tensor whose max is the cast's amax): torchtitan 9dec370's
    # ``_save_list`` names aten.abs beside aten.max, so every linear's input and weight leave a model-dtype copy of
    # their absolute values saved to the layer's backward; set by the framework
    fp8_abs_saved: bool = False
    # attention beyond hidden / heads (module docs; 0 / False: as hidden / heads gives)
    head_dim: int = 0  # query/key head size (no-rope part under latent attention); 0: hidden // heads
    qk_norm: bool = False
    # with QK norms: whether the layer keeps their outputs (the normalised, rotated queries and keys the attention
    # kernel saves) beside the projections (the norms' saved inputs), as a framework's autograd does (Megatron-LM's
    # TransformerEngine norms, torchtitan's); False: memo's executor, which normalises them again wherever the kernel
    # runs (a transient, `memo_sim.memplan.trace_gen`). Set by the framework (`Framework.for_model`)
    qk_norm_kept: bool = False
    # Megatron-LM's fine-grained activation offload (`memo_sim.policy.offload_modules`): a tensor two offload groups
    # save is copied to the host by each (its dedup looks within one group: fine_grained_activation_offload.py at
    # d98e8a64), so the attention output, saved by the kernel (core_attn) and by the output projection (attn_proj),
    # goes out and comes back twice; False: memo's executor, which moves it once. Set by the framework
    # (`Framework.for_model`)
    offload_copies_per_group: bool = False
    attention_sinks: bool = False
    sliding_window: int = 0
    sliding_layers: int = 0
    sliding_period: int = 0  # every N-th layer full, the N - 1 before it sliding (0: not stated; module docs)
    attention_chunk: int = 0  # chunked attention (Llama 4): a query attends to the keys of its own chunk only
    chunked_layers: int = 0
    chunked_period: int = 0  # every N-th layer full, the N - 1 before it chunked (0: not stated)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0  # > 0: multi-head latent attention
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    # mixture of experts (module docs; 0 experts: dense)
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0  # one routed expert's FFN width; 0: ffn
    shared_experts: int = 0
    shared_ffn: int = 0  # one shared expert's FFN width; 0: expert_ffn
    shared_gate: bool = False
    dense_layers: int = 0
    dense_period: int = 0  # every N-th layer MoE, the N - 1 before it dense (0: the dense layers first)
    router: str = "softmax"
    moe_bias: bool = False
    # group-limited routing (DeepSeek-V2/V3's n_group / topk_group, Megatron-LM's --moe-router-num-groups /
    # --moe-router-group-topk): the experts in router_groups equal groups, each token's top_k taken from its
    # best router_group_topk groups (0: not limited; `memo_sim.cost.moe` prices what it saves the dispatch)
    router_groups: int = 0
    router_group_topk: int = 0
    router_scaling: float = 1.0  # the routed experts' output scale (routed_scaling_factor): no cost
    # the k chosen weights renormalised to sum to 1 (norm_topk_prob; module docs): no cost
    router_normalised: bool = True
    # numerics the exports write and the simulator does not price (module docs; 0: not stated)
    rope_theta: float = 0.0
    norm_eps: float = 0.0
    aux_loss_coef: float = 0.0
    seq_aux: bool = False
    rope_scaling: str = ""
    rotary_fraction: float = 0.0  # the share of each head the rotary embedding turns (0: all)
    nope_period: int = 0  # every N-th layer without rotary embedding (0: none)
    positions: str = "rotary"  # rotary | learned: how positions enter (module docs)
    # multi-token prediction modules after the last layer (module docs; 0: none)
    mtp_layers: int = 0
    # what the source describes that memo neither counts nor prices (a sentence every what-if shows)
    not_modelled: str = ""
    # where ``gemm_format`` was given when a model file gave it ("FILE: gemm_format"), for the refusals that name it
    # (`memo_sim.cost.gemm_format.check_gemm_format`); "": a flag (--precision) or the default. Not part of what the
    # model is (not compared, never written: `to_dict`)
    gemm_format_from: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        # every way of building a model (presets, files, flags, plans) passes the one validator
        validated(_ModelIn, {f: getattr(self, f) for f in self.__dataclass_fields__}, f"model {self.name}")
        object.__setattr__(self, "_counts", {})  # the parameter counts, each computed once (`_counted`)

    @property
    def recipe(self) -> PrecisionRecipe:
        """The precision recipe: the one named, else fp32 for an fp32 model and Megatron's otherwise."""
        return RECIPES[self.precision or default_recipe(self.dtype)]

    @property
    def gemm(self) -> GemmFormat:
        """The layer GEMMs' format (`memo_sim.model.gemm_formats`), with one copy fewer where its casts skip the
        transposed copy (``fp8_transposes`` off)."""
        return _gemm(self.gemm_format, self.fp8_transposes)

    @property
    def gemm_words(self) -> str:
        """'' for GEMMs in the model dtype, else ', GEMMS IN FORMAT' for a one-line summary (MFU
        stays counted against the model dtype's peak)."""
        return f", {self.gemm_format} GEMMs" if self.gemm.quantised else ""

    def model_notes(self) -> list[str]:
        """What the model describes that memo approximates or leaves out, one sentence each (every
        what-if shows them)."""
        out = [self.not_modelled] if self.not_modelled else []
        if self.swiglu_limit:
            out.append(f"GPT-OSS's clamped SwiGLU (swiglu_limit {self.swiglu_limit:g}: gate * sigmoid(1.702 gate) * "
                       f"(up + 1), both halves clamped): priced as SwiGLU (the same GEMMs, one elementwise kernel); "
                       f"memo-exec runs it in the experts")
        if self.unplaced_attention_words():
            out.append(self.unplaced_attention_words())
        if self.moe and self.dense_layers:
            out.append(f"{self.dense_layers} of {self.layers} layers have a dense FFN (width {self.ffn}): the model's "
                       f"parameter count and each pipeline stage's model states are exact ({self.dense_where}), "
                       f"and so is their time, priced as a dense layer's in every schedule "
                       f"(`memo_sim.model.layer_kinds`); their activations and transients are priced as a MoE "
                       f"layer's")
        if self.mtp_layers:
            n = self.mtp_layers
            out.append(f"multi-token prediction ({modules_words(n)}, {fmt_params(self.mtp_params())} "
                       f"parameters beside the count above, the embedding and classifier shared): priced with the "
                       f"head (a pipeline's last stage) as the model's {'MoE ' if self.moe else ''}layer, a projection "
                       f"and a second "
                       f"pass of the classifier and loss each, forward and backward, its activations kept between "
                       f"them (its layer re-run under full recompute, as Megatron-LM checkpoints it); --mtp-layers 0 "
                       f"plans without it")
        return out

    @property
    def qk_head_dim(self) -> int:
        """One query/key head's width (the no-rope and rope parts under latent attention)."""
        return (self.head_dim or self.hidden // self.heads) + self.qk_rope_dim

    @property
    def value_head_dim(self) -> int:
        """One value head's width."""
        return self.v_head_dim or self.head_dim or self.hidden // self.heads

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora_rank > 0

    @property
    def q_dim(self) -> int:
        """Width of the queries of one token (all heads)."""
        return self.heads * self.qk_head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the keys of one token (all K/V heads; every head under latent attention)."""
        return (self.heads if self.mla else self.n_kv_heads) * self.qk_head_dim

    @property
    def v_dim(self) -> int:
        """Width of the values of one token (all K/V heads)."""
        return (self.heads if self.mla else self.n_kv_heads) * self.value_head_dim

    @property
    def attn_dim(self) -> int:
        """Width of the attention output of one token (the output projection's input)."""
        return self.heads * self.value_head_dim

    @property
    def attention_width(self) -> float:
        """heads x (query/key + value head) / 2: the width causal attention's FLOPs scale with
        (hidden for a standard layer, `memo_sim.model.flops.causal_attention_flops`)."""
        return self.heads * (self.qk_head_dim + self.value_head_dim) / 2

    def attention_flop_fraction(self, seq: int) -> float:
        """The layers' mean attention FLOPs over those of full causal attention at ``seq`` tokens:
        a sliding-window layer's query attends to at most ``sliding_window`` keys, so it computes
        w·(s - w/2) of the s²/2 score elements (all of them when s <= w); a chunked layer's query attends
        causally inside its own ``attention_chunk`` of c tokens, (n·c² + r²)/2 of them for n whole chunks and a
        last one of r (all of them when s <= c)."""
        sliding = chunked = 1.0
        if self.sliding_layers and seq > self.sliding_window:
            w = self.sliding_window
            sliding = w * (seq - w / 2) / (seq * seq / 2)
        if self.chunked_layers and seq > self.attention_chunk:
            c = self.attention_chunk
            n, r = divmod(seq, c)
            chunked = (n * c * c + r * r) / (seq * seq)
        full = self.layers - self.sliding_layers - self.chunked_layers
        return (self.sliding_layers * sliding + self.chunked_layers * chunked + full) / self.layers

    @property
    def fc1_width(self) -> int:
        return self.fc1_of(self.ffn)

    # --- mixture of experts ---------------------------------------------------------------
    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_router(self) -> Router:
        return router(self.router)

    @property
    def weights_normalised(self) -> bool:
        """Whether the k chosen routing weights are renormalised to sum to 1: the model's ``router_normalised``
        where its router normalises at all (not Llama 4's ``sigmoid_topk``; module docs)."""
        return self.router_normalised and self.moe_router.normalised

    @property
    def moe_layers(self) -> int:
        """Layers whose FFN is the MoE block (0 for a dense model)."""
        return self.layers - self.dense_layers if self.moe else 0

    @property
    def mixes_dense_layers(self) -> bool:
        """A mixture of experts whose ``dense_layers`` keep a dense FFN: pipeline stages then hold
        different parameters wherever those layers fall (`memo_sim.cost.sppo.stage_dense_layer_count`)."""
        return self.moe and self.moe_layers < self.layers

    @property
    def dense_where(self) -> str:
        """Where a MoE model's dense-FFN layers lie, in words ('' for none)."""
        if not self.mixes_dense_layers:
            return ""
        if self.dense_period:
            n = self.dense_period
            return ("alternating, a dense layer before each MoE layer" if n == 2
                    else f"{n - 1} dense layers before each MoE layer")
        return f"the first {self.dense_layers}"

    def unplaced_attention_words(self) -> str:
        """'' unless the sliding-window or chunked layers have no period placing them: a pipeline stage's layers are
        then priced at the mean of the model's (`memo_sim.model.layer_kinds`)."""
        some = [f"{n} {what}" for what, n, period in (("sliding-window", self.sliding_layers, self.sliding_period),
                                                      ("chunked", self.chunked_layers, self.chunked_period))
                if n and n < self.layers and not period]
        if not some:
            return ""
        return (f"the {' and '.join(some)} layers have no period placing them (Qwen's window from max_window_layers "
                f"on has none in memo): a pipeline stage's layers are priced at the mean attention of the model's "
                f"{self.layers} layers, whichever it holds")

    def window_at(self, i: int) -> int | None:
        """The sliding window of layer ``i`` (0-based; a multi-token-prediction module's ``layers + k`` as the last
        layer): ``sliding_window`` where it slides, 0 where it attends to every earlier token; None where the model does
        not say (``sliding_layers`` some but not all of the layers, no ``sliding_period``)."""
        return _pattern_at(self.layers, i, self.sliding_layers, self.sliding_period, self.sliding_window)

    def chunk_at(self, i: int) -> int | None:
        """The attention chunk of layer ``i`` (0-based; a multi-token-prediction module's ``layers + k`` as the last
        layer): ``attention_chunk`` where it is chunked, 0 where it attends to every earlier token; None where the
        model does not say (``chunked_layers`` some but not all of the layers, no ``chunked_period``)."""
        return _pattern_at(self.layers, i, self.chunked_layers, self.chunked_period, self.attention_chunk)

    def dense_view(self) -> "ModelConfig":
        """The model without its experts: a dense layer of FFN width ``ffn`` (a mixture of experts' dense layers,
        `memo_sim.model.layer_kinds`; the dense layer whose skeletal tensors memo-exec saves for every layer of a
        MoE model too, `memo_exec.layer`); the model itself where it is dense."""
        if not self.moe:
            return self
        return replace(self, experts=0, top_k=0, expert_ffn=0, shared_experts=0, shared_ffn=0, shared_gate=False,
                       dense_layers=0, dense_period=0, moe_bias=False, router_groups=0, router_group_topk=0,
                       router_scaling=1.0)

    def dense_layer_at(self, i: int) -> bool:
        """Whether layer ``i`` (0-based) of a mixture of experts keeps a dense FFN: one of the first
        ``dense_layers``, or with ``dense_period`` N every layer but each N-th (module docs); False for a
        dense model, whose every layer is dense and has no MoE block."""
        if not self.mixes_dense_layers:
            return False
        if self.dense_period:
            return (i + 1) % self.dense_period != 0
        return i < self.dense_layers

    @property
    def expert_width(self) -> int:
        """One routed expert's FFN width."""
        return self.expert_ffn or self.ffn

    @property
    def expert_fc1_width(self) -> int:
        return self.fc1_of(self.expert_width)

    @property
    def shared_width(self) -> int:
        """The shared experts' FFN width, all of them together (0 without shared experts)."""
        return self.shared_experts * (self.shared_ffn or self.expert_width)

    def fc1_of(self, width: int) -> int:
        """The first GEMM's output width of an FFN of ``width``: gate and up (2 x width) for SwiGLU."""
        return 2 * width if self.ffn_type == "swiglu" else width

    def _ffn_linear(self, width: int) -> int:
        """The GEMM weights of an FFN of ``width``: h -> fc1, width -> h."""
        return self.hidden * self.fc1_of(width) + width * self.hidden

    def _ffn_params(self, width: int, bias: bool) -> int:
        """An FFN's weights and, with ``bias``, its biases (fc1's and the output's)."""
        return self._ffn_linear(width) + ((self.fc1_of(width) + self.hidden) if bias else 0)

    @_counted
    def expert_params(self) -> int:
        """One routed expert's weights (and biases under ``moe_bias``)."""
        return self._ffn_params(self.expert_width, self.moe_bias)

    @_counted
    def expert_layer_params(self) -> int:
        """The routed experts of one MoE layer: what expert parallelism shards."""
        return self.experts * self.expert_params()

    @_counted
    def moe_block_params(self) -> int:
        """One MoE layer's FFN block: the router, the routed and the shared experts."""
        if not self.moe:
            return 0
        shared = self._ffn_params(self.shared_width, False) + (self.hidden if self.shared_gate else 0) \
            if self.shared_experts else 0
        return self.moe_router.params(self.hidden, self.experts, self.moe_bias) + self.expert_layer_params() + shared

    @_counted
    def dense_ffn_params(self) -> int:
        """A dense layer's FFN."""
        return self._ffn_params(self.ffn, self.bias == "all" and self.ffn_type != "swiglu")

    @property
    def norm_params(self) -> int:
        """Weights of one normalisation: scale and shift (LayerNorm) or scale only (RMSNorm)."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    @_counted
    def attention_params(self) -> int:
        """One layer's attention: the projections (and their biases), QK norms, sinks."""
        h = self.hidden
        if self.mla:
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.q_dim) if self.q_lora_rank \
                else h * self.q_dim
            kv = h * (self.kv_lora_rank + self.qk_rope_dim) + self.kv_lora_rank \
                + self.kv_lora_rank * self.heads * (self.head_dim + self.value_head_dim)
            attn = q + kv + self.attn_dim * h
        else:
            attn = h * (self.q_dim + self.kv_dim + self.v_dim) + self.attn_dim * h
        if self.bias in ("all", "qkv"):
            attn += self.q_dim + self.kv_dim + self.v_dim  # QKV bias
        if self.bias == "all":
            attn += h  # output projection bias
        if self.qk_norm:
            attn += 2 * self.qk_head_dim
        if self.attention_sinks:
            attn += self.heads
        return attn

    @_counted
    def layer_params(self) -> int:
        """Weights and biases of one layer: attention, FFN (the MoE block for a MoE model: the
        layer the simulator repeats), two norms."""
        ffn = self.moe_block_params() if self.moe else self.dense_ffn_params()
        return self.attention_params() + ffn + 2 * self.norm_params

    @_counted
    def linear_params(self) -> int:
        """Weights of one layer's linear GEMMs (the attention projections, the FFN's or the
        experts'), no biases: what a quantised GEMM format keeps quantised copies of."""
        h = self.hidden
        attn = self.attention_params() - (2 * self.qk_head_dim if self.qk_norm else 0) - (
            self.heads if self.attention_sinks else 0)
        if self.bias in ("all", "qkv"):
            attn -= self.q_dim + self.kv_dim + self.v_dim
        if self.bias == "all":
            attn -= h
        if self.mla:
            attn -= self.kv_lora_rank + self.q_lora_rank  # the latent norms
        ffn = self.expert_linear_params() + self._ffn_linear(self.shared_width) if self.moe else self._ffn_linear(self.ffn)
        return attn + ffn

    @_counted
    def replicated_layer_params(self) -> int:
        """Weights of one (MoE) layer every TP rank holds whole: latent attention's down projections and
        their norms, the router (Megatron-Core keeps both duplicated over TP)."""
        out = 0
        if self.mla:
            out += self.hidden * (self.kv_lora_rank + self.qk_rope_dim) + self.kv_lora_rank
            if self.q_lora_rank:
                out += self.hidden * self.q_lora_rank + self.q_lora_rank
        if self.moe:
            out += self.moe_router.params(self.hidden, self.experts, self.moe_bias)
        return out

    @_counted
    def replicated_params(self) -> int:
        """Every layer's `replicated_layer_params` (the router only on MoE layers)."""
        if not (self.mla or self.moe):
            return 0
        router = self.moe_router.params(self.hidden, self.experts, self.moe_bias) if self.moe else 0
        return self.layers * (self.replicated_layer_params() - router) + self.moe_layers * router

    @_counted
    def expert_linear_params(self) -> int:
        """The routed experts' linear weights of one MoE layer (no biases; 0 for a dense model)."""
        if not self.moe:
            return 0
        return self.experts * self._ffn_linear(self.expert_width)

    @_counted
    def embedding_params(self) -> int:
        """Everything outside the layers: the token embedding, the classifier when it is not tied
        to it, and the final norm."""
        return (1 if self.tied_embeddings else 2) * self.vocab * self.hidden + self.norm_params

    @_counted
    def dense_layer_params(self) -> int:
        """One layer with an FFN of width ``ffn``: a MoE model's dense layers (a dense model's every layer)."""
        return self.attention_params() + self.dense_ffn_params() + 2 * self.norm_params

    @_counted
    def params(self) -> int:
        """Every parameter: the layers (dense layers of a MoE model with their own FFN) and the rest."""
        return (self.moe_layers * self.layer_params() + (self.layers - self.moe_layers) * self.dense_layer_params()
                + self.embedding_params())

    @_counted
    def routed_params(self) -> int:
        """All layers' routed experts (what expert parallelism shards)."""
        return self.moe_layers * self.expert_layer_params()

    @_counted
    def active_params(self) -> int:
        """Parameters one token uses: every one but the routed experts it is not sent to, the token
        embedding included (as Mixtral-8x7B's published 12.9B active counts it: memo 12.88B). Model
        cards differ here: gpt-oss's leaves the input embedding out (gpt-oss-20b 3.61B active; memo
        4.19B, 3.61B less its 0.58B embedding). MFU's FLOPs (`memo_sim.model.flops`) use this count."""
        if not self.moe:
            return self.params()
        return self.params() - self.moe_layers * (self.experts - self.top_k) * self.expert_params()

    # --- multi-token prediction ------------------------------------------------------------
    @property
    def mtp_moe(self) -> bool:
        """Whether a multi-token-prediction module's layer is a MoE layer: the last layer's kind."""
        return self.moe and not self.dense_layer_at(self.layers - 1)

    @_counted
    def mtp_module_params(self) -> int:
        """One multi-token-prediction module without the embedding and classifier it shares with the model: a
        layer of the last layer's kind, the projection of [norm(embedding); norm(hidden)] (2h -> h) and three
        norms (DeepSeek-V3's enorm, hnorm and the head's norm)."""
        layer = self.layer_params() if self.mtp_moe else self.dense_layer_params()
        return layer + self.mtp_projection_params + self.mtp_norm_params

    @property
    def mtp_projection_params(self) -> int:
        """One module's projection of [norm(embedding); norm(hidden)]: 2h -> h, no bias (what TP splits)."""
        return 2 * self.hidden * self.hidden

    @property
    def mtp_norm_params(self) -> int:
        """One module's three norms (embedding, hidden state, its output): whole on every TP rank."""
        return 3 * self.norm_params

    @_counted
    def mtp_params(self) -> int:
        """Every multi-token-prediction module's parameters (not in `params`: module docs)."""
        return self.mtp_layers * self.mtp_module_params()

    @_counted
    def mtp_routed_params(self) -> int:
        """The routed experts of the modules' layers (what expert parallelism shards)."""
        return self.mtp_layers * self.expert_layer_params() if self.mtp_moe else 0

    @_counted
    def mtp_replicated_params(self) -> int:
        """What every TP rank holds whole of the modules (`replicated_layer_params`; no router on a dense layer)."""
        router = self.moe_router.params(self.hidden, self.experts, self.moe_bias) if self.moe else 0
        return self.mtp_layers * (self.replicated_layer_params() - (0 if self.mtp_moe else router))

    @_counted
    def mtp_active_params(self) -> int:
        """The modules' parameters one token uses (the top-k of the routed experts), for MFU's FLOPs."""
        unused = (self.experts - self.top_k) * self.expert_params() if self.mtp_moe else 0
        return self.mtp_params() - self.mtp_layers * unused

    @_counted
    def trained_params(self) -> int:
        """The parameters training holds and updates: `params` and the multi-token-prediction modules."""
        return self.params() + self.mtp_params()

    @_counted
    def trained_routed_params(self) -> int:
        return self.routed_params() + self.mtp_routed_params()

    @_counted
    def trained_replicated_params(self) -> int:
        return self.replicated_params() + self.mtp_replicated_params()

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["gemm_format_from"]  # where a file gave the format: said in refusals, never written (field docs)
        for k, v in _QUIET_DEFAULTS.items():
            if d[k] == v:
                del d[k]
        return d

    @classmethod
    def from_dict(cls, d: Any, source: str = "model") -> "ModelConfig":
        if isinstance(d, dict):
            d = {"name": source, **d}
        m = validated(_ModelIn, d, source)
        if not m.experts:
            given = [f for f in EXPERT_FIELDS if getattr(m, f) != _ModelIn.model_fields[f].default]
            if given:
                they = "they describe" if len(given) > 1 else "it describes"
                raise MemoError(f"{source}: {', '.join(given)}: {they} experts and the model has none (experts 0); "
                                f"give experts (and top_k) too, or leave {'them' if len(given) > 1 else 'it'} out")
        return cls(**m.model_dump())


@lru_cache(maxsize=64)
def _gemm(name: str, transposes: bool) -> GemmFormat:
    """`ModelConfig.gemm`: the format called ``name``, less its transposed copy where ``transposes`` is off."""
    fmt = gemm_format(name)
    return fmt if transposes or not fmt.transposed_copy else replace(fmt, copies=fmt.copies - 1)


# GPT-OSS's rotary scaling as its config.json states it (`memo_sim.model.rope.rope_scaling_words`)
GPT_OSS_YARN = "yarn factor 32, original_max_position_embeddings 4096, beta_fast 32, beta_slow 1, truncate False"

PRESETS: dict[str, ModelConfig] = {
    # MEMO paper, table 2 (GPT, vocab 50257)
    "gpt-7b": ModelConfig("gpt-7b", 32, 4096, 32, 16384),
    "gpt-13b": ModelConfig("gpt-13b", 40, 5120, 40, 20480),
    "gpt-30b": ModelConfig("gpt-30b", 48, 7168, 56, 28672),
    "gpt-65b": ModelConfig("gpt-65b", 80, 8192, 64, 32768),
    # GPT-3 paper
    "gpt-175b": ModelConfig("gpt-175b", 96, 12288, 96, 49152),
    # LLaMA / LLaMA-2 papers (shapes only: counted with GPT's LayerNorms, attention biases and tied
    # embeddings, as earlier releases did and the golden tests keep; llama-2-7b and llama-2-70b
    # below describe the released models exactly: RMSNorm, no biases, untied embeddings)
    "llama-7b": ModelConfig("llama-7b", 32, 4096, 32, 11008, vocab=32000, ffn_type="swiglu"),
    "llama-70b": ModelConfig("llama-70b", 80, 8192, 64, 28672, vocab=32000, kv_heads=8, ffn_type="swiglu"),
    # Hugging Face config.json of each model (`memo_sim.model.hf_config` reads the same files):
    # meta-llama/Llama-2-7b-hf, -70b-hf; meta-llama/Llama-3.1-8B, -70B, -405B; Qwen/Qwen2.5-7B, -72B;
    # mistralai/Mistral-7B-v0.3
    # (the rotary base, the norms' epsilon and rotary scaling of each config.json; a review found Qwen2.5-72B's and
    # Mistral-7B's left unstated, so the exports fell back to Megatron's --rotary-base 10000. Checked 2026-12-01 against
    # copies of the config.json on huggingface.co: Mistral-7B-v0.3 rope_theta 1000000.0, rms_norm_eps 1e-05
    # (unsloth/mistral-7b-v0.3, _name_or_path mistralai/Mistral-7B-v0.3; Mistral's params.json the same); the base
    # Qwen2.5-72B rope_theta 1000000.0, rms_norm_eps 1e-05 (BitStack/BitStack-Qwen2.5-72B,
    # sumuks/purple-wintermute-0.2-72b, _name_or_path Qwen/Qwen2.5-72B; Qwen2.5-72B-Instruct's says 1e-06: the base and
    # the Instruct configs differ there, as Qwen/Qwen2-72B's 1e-05 and Qwen/Qwen2-72B-Instruct's 1e-06 do)
    **{name: ModelConfig(name, layers, hidden, heads, ffn, vocab=vocab, kv_heads=kv, ffn_type="swiglu",
                         norm="rmsnorm", bias=bias, tied_embeddings=False, rope_theta=theta, norm_eps=eps,
                         rope_scaling=scaling)
       for name, layers, hidden, heads, kv, ffn, vocab, bias, theta, eps, scaling in (
           ("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, "none", 10000.0, 1e-5, ""),
           ("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, "none", 10000.0, 1e-5, ""),
           ("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, "none", 500000.0, 1e-5, "llama3 factor 8"),
           ("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, "none", 500000.0, 1e-5, "llama3 factor 8"),
           ("llama-3.1-405b", 126, 16384, 128, 8, 53248, 128256, "none", 500000.0, 1e-5, "llama3 factor 8"),
           ("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, "qkv", 1e6, 1e-6, ""),
           ("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, "qkv", 1e6, 1e-5, ""),
           ("mistral-7b", 32, 4096, 32, 8, 14336, 32768, "none", 1e6, 1e-5, ""))},
    # Qwen3 (dense): heads of 128 whatever hidden / heads is (kept under --hidden, as the config.json's head_dim is
    # read), an RMSNorm over each query and key head; the
    # config.json of Qwen/Qwen3-8B, -14B, -32B (tests/data/hf holds them, and the counts transformers gives them)
    **{name: ModelConfig(name, layers, hidden, heads, ffn, vocab=151936, kv_heads=8, ffn_type="swiglu",
                         norm="rmsnorm", bias="none", tied_embeddings=False,
                         head_dim=128, qk_norm=True, rope_theta=1e6, norm_eps=1e-6)
       for name, layers, hidden, heads, ffn in (("qwen3-8b", 36, 4096, 32, 12288), ("qwen3-14b", 40, 5120, 40, 17408),
                                                ("qwen3-32b", 64, 5120, 64, 25600))},
    # mixtures of experts, from the Hugging Face config.json of each (tests/data/hf holds them, and the
    # parameter counts transformers gives them): mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B,
    # Qwen/Qwen1.5-MoE-A2.7B, deepseek-ai/DeepSeek-V2-Lite, deepseek-ai/DeepSeek-V3, openai/gpt-oss-20b
    "mixtral-8x7b": ModelConfig("mixtral-8x7b", 32, 4096, 32, 14336, vocab=32000, kv_heads=8, ffn_type="swiglu",
                                norm="rmsnorm", bias="none", tied_embeddings=False, experts=8, top_k=2,
                                rope_theta=1e6, norm_eps=1e-5, aux_loss_coef=0.02),
    "qwen3-30b-a3b": ModelConfig("qwen3-30b-a3b", 48, 2048, 32, 6144, vocab=151936, kv_heads=4, ffn_type="swiglu",
                                 norm="rmsnorm", bias="none", tied_embeddings=False, head_dim=128, qk_norm=True,
                                 experts=128, top_k=8, expert_ffn=768, rope_theta=1e6, norm_eps=1e-6,
                                 aux_loss_coef=0.001),
    "qwen3-235b-a22b": ModelConfig("qwen3-235b-a22b", 94, 4096, 64, 12288, vocab=151936, kv_heads=4,
                                   ffn_type="swiglu", norm="rmsnorm", bias="none", tied_embeddings=False, head_dim=128,
                                   qk_norm=True, experts=128, top_k=8, expert_ffn=1536, rope_theta=1e6, norm_eps=1e-6,
                                   aux_loss_coef=0.001),
    "qwen2-moe-a2.7b": ModelConfig("qwen2-moe-a2.7b", 24, 2048, 16, 5632, vocab=151936, ffn_type="swiglu",
                                   norm="rmsnorm", bias="qkv", tied_embeddings=False, experts=60, top_k=4,
                                   expert_ffn=1408, shared_experts=1, shared_ffn=5632, shared_gate=True,
                                   router_normalised=False, rope_theta=1e6, norm_eps=1e-6, aux_loss_coef=0.001),
    "deepseek-v2-lite": ModelConfig("deepseek-v2-lite", 27, 2048, 16, 10944, vocab=102400, ffn_type="swiglu",
                                    norm="rmsnorm", bias="none", tied_embeddings=False, head_dim=128, kv_lora_rank=512,
                                    qk_rope_dim=64, v_head_dim=128, experts=64, top_k=6, expert_ffn=1408,
                                    shared_experts=2, shared_ffn=1408, dense_layers=1, router_normalised=False,
                                    rope_theta=10000.0, norm_eps=1e-6, aux_loss_coef=0.001, seq_aux=True,
                                    rope_scaling="yarn factor 40, mscale 0.707, mscale_all_dim 0.707, "
                                                 "original_max_position_embeddings 4096, beta_fast 32, beta_slow 1"),
    "deepseek-v3": ModelConfig("deepseek-v3", 61, 7168, 128, 18432, vocab=129280, ffn_type="swiglu", norm="rmsnorm",
                               bias="none", tied_embeddings=False, head_dim=128, q_lora_rank=1536, kv_lora_rank=512,
                               qk_rope_dim=64, v_head_dim=128, experts=256, top_k=8, expert_ffn=2048, shared_experts=1,
                               shared_ffn=2048, dense_layers=3, router="sigmoid", router_groups=8,
                               router_group_topk=4, router_scaling=2.5, rope_theta=10000.0, norm_eps=1e-6,
                               aux_loss_coef=0.001, seq_aux=True,
                               rope_scaling="yarn factor 40, mscale 1, mscale_all_dim 1, "
                                            "original_max_position_embeddings 4096, beta_fast 32, beta_slow 1",
                               mtp_layers=1),
    "gpt-oss-20b": ModelConfig("gpt-oss-20b", 24, 2880, 64, 2880, vocab=201088, kv_heads=8, ffn_type="swiglu",
                               norm="rmsnorm", bias="all", tied_embeddings=False, head_dim=64, attention_sinks=True,
                               sliding_window=128, sliding_layers=12, sliding_period=2, experts=32, top_k=4,
                               moe_bias=True, rope_theta=150000.0, norm_eps=1e-5, aux_loss_coef=0.9,
                               rope_scaling=GPT_OSS_YARN, swiglu_limit=7.0),
    "gpt-oss-120b": ModelConfig("gpt-oss-120b", 36, 2880, 64, 2880, vocab=201088, kv_heads=8, ffn_type="swiglu",
                                norm="rmsnorm", bias="all", tied_embeddings=False, head_dim=64, attention_sinks=True,
                                sliding_window=128, sliding_layers=18, sliding_period=2, experts=128, top_k=4,
                                moe_bias=True, rope_theta=150000.0, norm_eps=1e-5, aux_loss_coef=0.9,
                                rope_scaling=GPT_OSS_YARN, swiglu_limit=7.0),
    "glm-4.5-air": ModelConfig("glm-4.5-air", 46, 4096, 96, 10944, vocab=151552, kv_heads=8, ffn_type="swiglu",
                               norm="rmsnorm", bias="qkv", tied_embeddings=False, head_dim=128, experts=128, top_k=8,
                               expert_ffn=1408, shared_experts=1, shared_ffn=1408, dense_layers=1, router="sigmoid",
                               rope_theta=1000000.0, norm_eps=1e-5, rotary_fraction=0.5, mtp_layers=1),
    "llama-4-scout": ModelConfig("llama-4-scout", 48, 5120, 40, 8192, vocab=202048, kv_heads=8, ffn_type="swiglu",
                                 norm="rmsnorm", bias="none", tied_embeddings=False, head_dim=128, attention_chunk=8192,
                                 chunked_layers=36, chunked_period=4, experts=16, top_k=1, shared_experts=1,
                                 shared_ffn=8192, router="sigmoid_topk", rope_theta=500000.0, norm_eps=1e-5,
                                 aux_loss_coef=0.001, rope_scaling="llama3 factor 16, high_freq_factor 1",
                                 nope_period=4,
                                 not_modelled="QK norm: an L2 norm of the rotary layers' queries and keys, without "
                                              "weights (not priced); the vision tower is not modelled (the text "
                                              "model alone)"),
}


def with_overrides(base: ModelConfig, source: str = "model flags", rename: bool = True, **over) -> ModelConfig:
    """``base`` with the given fields replaced (None: left as it is), the one rule both CLIs use: ``hidden``
    keeps the FFN widths' ratio to the width (GPT: 4h), the dense FFN's unless ``ffn`` is given, the
    routed and shared experts' always (they have no flag). ``layers`` keeps the share of the layers that slide
    (``sliding_layers``) and of a MoE model's dense layers (``dense_layers``, at least one MoE layer left), rounded,
    and at least one of each where the model has some (a period, where it places them, decides instead):
    GPT-OSS-20B's 12 sliding layers of 24 are 1 of ``--layers 2``, DeepSeek-V3's 3 dense layers of 61 are 1 of
    ``--layers 4``. The head dimension and MLA's ranks are the
    preset's (heads x head_dim need not be the width). ``rename``: another model is named ``NAME-custom``
    (the same one with its GEMMs in another format alone keeps its name); a flag giving the model's own value changes
    nothing (``--mtp-layers 1`` on DeepSeek-V3 keeps its name)."""
    over = {k: v for k, v in over.items() if v is not None and getattr(base, k, None) != v}
    if not over:
        return base
    d = base.to_dict()
    if over.get("hidden") is not None:  # the experts' widths have no flag of their own: they always follow
        for k in ("expert_ffn", "shared_ffn") + (() if "ffn" in over else ("ffn",)):
            if d.get(k):
                d[k] = max(1, round(d[k] * over["hidden"] / base.hidden))
    if over.get("layers") is not None and "sliding_layers" not in over and "dense_layers" not in over:
        n = over["layers"]
        for k, most in (("sliding_layers", n), ("chunked_layers", n), ("dense_layers", n - 1)):  # a MoE keeps one
            if d.get(k):  # at least one where the model has some (a review: DeepSeek-V3's 3 dense layers of 61
                d[k] = max(min(1, most), min(most, round(d[k] * n / base.layers)))  # were 0 of --layers 4)
        for k, period in (("sliding_layers", "sliding_period"), ("chunked_layers", "chunked_period"),
                          ("dense_layers", "dense_period")):
            if d.get(period) and k == "dense_layers" and n < d[period]:  # no MoE layer in the pattern: first k
                d[period] = 0
            elif d.get(period):  # the pattern places them: every N-th of the n layers full (MoE)
                d[k] = period_layers(n, d[period])
        if d.get("nope_period", 0) > n:  # fewer layers than the period: no layer without rotary embedding
            d["nope_period"] = 0
    d.update(over)
    if rename and set(over) - {"gemm_format"}:
        d["name"] = f"{base.name}-custom"
    if over.get("kv_heads") and base.mla:  # the flag's name (the validator's refusal names the field)
        raise MemoError(f"--kv-heads {over['kv_heads']}: {base.name} has multi-head latent attention (kv_lora_rank "
                        f"{base.kv_lora_rank}), whose every head has its own keys and values, up-projected from the "
                        f"shared latent; leave --kv-heads out")
    kv = base.n_kv_heads
    heads = over.get("heads", base.heads)
    if over.get("kv_heads") and heads % over["kv_heads"]:  # the flag's name, not the validator's internal label
        raise MemoError(f"--kv-heads {over['kv_heads']}: the K/V heads must divide the {heads} query heads; give "
                        f"--kv-heads a divisor of {heads}")
    if "heads" in over and "kv_heads" not in over and base.kv_heads is not None and over["heads"] % kv:
        raise MemoError(f"--heads {over['heads']}: {base.name} has {kv} K/V heads, which must divide the query heads; "
                        f"give --heads a multiple of {kv}, or --kv-heads")
    if base.gemm_format_from and "gemm_format" not in over:  # the file's format kept: still the file's to name
        d["gemm_format_from"] = base.gemm_format_from
    out = ModelConfig.from_dict(d, source=source)
    if "ffn" in over and out.moe and out.expert_ffn and not out.mixes_dense_layers:
        raise MemoError(f"--ffn {over['ffn']}: every layer of {base.name} is a MoE layer, whose experts' width "
                        f"({out.expert_ffn}) is their own and follows --hidden; no layer has a dense FFN for --ffn to "
                        f"set: leave --ffn out, or give a model file with the expert width you want (expert_ffn)")
    return out


# the presets whose Hugging Face repository names are not theirs (lower case, without the organisation): the one
# place `get_model` finds them by (a review: --model mistralai/Mixtral-8x7B-v0.1 was 'unknown')
HF_NAMES = {"mixtral-8x7b-v0.1": "mixtral-8x7b", "mistral-7b-v0.3": "mistral-7b",
            "llama-4-scout-17b-16e": "llama-4-scout", "llama-2-7b-hf": "llama-2-7b", "llama-2-70b-hf": "llama-2-70b",
            "qwen1.5-moe-a2.7b": "qwen2-moe-a2.7b"}


def preset_key(name: str) -> str:
    """The preset ``name`` means: itself, lower-cased, without a Hugging Face organisation (``Qwen/Qwen3-32B``), and
    through `HF_NAMES` where Hugging Face spells the model otherwise (``mistralai/Mixtral-8x7B-v0.1``)."""
    key = name.lower()
    if key.count("/") == 1 and key.split("/", 1)[1] in (*PRESETS, *HF_NAMES):  # an HF repo id
        key = key.split("/", 1)[1]
    return HF_NAMES.get(key, key)


def _release_words(preset: str) -> str:
    """' (mistral-7b-v0.3: vocab 32768, no sliding window)' for a preset that is one release of a model Hugging Face
    names by version (`HF_NAMES`), so that a near name of another release (``mistral-7b-v0.1``: vocab 32000, a
    4096-token window) is not taken for it (a review); '' for the others."""
    release = next((hf for hf, p in HF_NAMES.items() if p == preset and hf != preset), "")
    if not release:
        return ""
    m = PRESETS[preset]
    window = f"a {m.sliding_window}-token sliding window" if m.sliding_layers else "no sliding window"
    return f" ({release}: vocab {m.vocab}, {window}; for another release give its config.json)"


def get_model(name: str | os.PathLike) -> ModelConfig:
    """A preset by name (as Hugging Face spells it too: ``Qwen3-32B``, ``Qwen/Qwen3-32B``,
    ``mistralai/Mixtral-8x7B-v0.1``), or a model file (a ``str`` or ``Path``: a .yaml/.json model file, a Hugging
    Face config.json or its folder). Anything else (None, a number, an empty name) raises `MemoError`."""
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if not isinstance(name, str) or not name.strip():
        raise MemoError(f"model {name!r}: give a preset's name (a str such as 'llama-3.1-8b'; `memo-sim models` "
                        f"lists them) or a model file's path (a str or Path)")
    p = Path(name)
    if p.suffix in (".json", ".yaml", ".yml") or p.is_dir():
        return model_from_file(p)
    key = preset_key(name)
    if key in PRESETS:
        return PRESETS[key]
    near = difflib.get_close_matches(key, PRESETS, n=1, cutoff=0.8)
    hint = f"did you mean {near[0]!r}{_release_words(near[0])}? " if near else ""
    raise MemoError(f"model {name!r} unknown; {hint}presets: {', '.join(PRESETS)} (or a .yaml/.json model file, a "
                    f"Hugging Face config.json or its folder, or --layers/--hidden/...)")


def model_from_file(path: str | Path) -> ModelConfig:
    """A model from a memo model file (.yaml/.json with ModelConfig's fields) or a Hugging Face
    config.json (or the folder holding one; `memo_sim.model.hf_config`)."""
    path = config_path(path)
    if not path.exists():
        raise MemoError(f"{path}: no such model file; give a preset name (memo-sim models lists them), or the path "
                        f"of a .yaml/.json model file or a Hugging Face config.json")
    try:
        text = read_utf8(path, MemoError)
        raw = json.loads(text) if path.suffix == ".json" else load_yaml(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise MemoError(f"{path}: cannot parse model file ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise MemoError(f"{path}: nested too deeply to be a model file; check the file") from None
    if not isinstance(raw, dict):
        raise MemoError(f"{path}: a model file is a mapping of fields (layers, hidden, heads, ffn, vocab)")
    if is_hf_config(raw):
        lm, how = language_model(raw, source=str(path))  # a multimodal wrapper's text_config, or by architectures
        src = f"{path} text_config" if lm is not raw and isinstance(raw.get("text_config"), dict) else str(path)
        fields = hf_model_fields(with_defaults(path, lm), source=src, name=model_name(path))  # where a field lies
        if how:  # what the wrapper leaves out (its vision tower) before the language model's own notes (a review)
            add_note(fields, how, first=True)
        try:
            return ModelConfig.from_dict(fields, source=str(path))
        except MemoError as e:  # memo's field names, with the config.json keys they were read from
            raise MemoError(str(e) + hf_names_hint(str(e).removeprefix(f"{path}:"), lm)) from None  # not the path
    kind = str(raw.get("schema", ""))
    if kind.startswith(("memo-plan/", "memo-hardware-profile/")):
        what = "a memo plan" if kind.startswith("memo-plan/") else "a hardware profile"
        raise MemoError(f"{path}: {what}, not a model; --model takes a preset (memo-sim models), a Hugging Face "
                        f"config.json or a memo model file (layers, hidden, heads, ffn, vocab)")
    raw.setdefault("name", path.stem)
    if not isinstance(raw["name"], str):
        raw["name"] = str(raw["name"])
    if "gemm_format" in raw:  # named in a refusal of the format as the file's field, not a flag (a review)
        raw["gemm_format_from"] = f"model file {path}: gemm_format"
    try:
        return ModelConfig.from_dict(raw, source=str(path))
    except MemoError as e:  # a config.json without the keys that say so (a review: 'layers: missing field')
        hf = [k for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size") if k in raw]
        if not hf:
            raise
        raise MemoError(f"{e}; the file has Hugging Face keys ({', '.join(hf)}) but neither model_type nor "
                        f"architectures, which make it read as a config.json: add its model_type (e.g. \"llama\", "
                        f"\"qwen3_moe\")") from None
