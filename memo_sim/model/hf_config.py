"""Models from a Hugging Face ``config.json`` (local files only; no network).

Reads the decoder families memo can model: ``llama``, ``mistral``, ``qwen2``, ``qwen3`` (its
``head_dim`` and the RMSNorm over each query and key head), ``gpt2``, ``gpt_neox``, by their own field
names (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
``intermediate_size``, ``vocab_size``,
``tie_word_embeddings``, ``hidden_act``, ``torch_dtype`` / ``dtype``; GPT-2's ``n_embd``,
``n_layer``, ``n_head``, ``n_inner``, ``activation_function``), with each family's defaults for
fields a file leaves out (those of its ``transformers`` configuration class). When
``transformers`` is installed, its ``AutoConfig.for_model`` fills those defaults itself (nothing
is downloaded: the file's fields are all it reads).

Mixture-of-experts families (`moe_fields`): ``mixtral``, ``qwen2_moe``, ``qwen3_moe``,
``deepseek_v2``, ``deepseek_v3`` (multi-head latent attention), ``gpt_oss`` (alternating
sliding-window attention, attention sinks, biased router and experts), ``glm4_moe`` (GLM-4.5: DeepSeek-V3's
routing beside grouped-query attention, q/k/v biases, optional QK norms) and ``llama4_text`` (Llama 4: a shared expert
beside the routed ones, interleaved dense layers, chunked attention); their parameter counts
match transformers' models built on the meta device (tests/data/hf/moe_param_counts.json).
A router's ``norm_topk_prob`` (whether its k chosen weights are renormalised to sum to 1) is read as memo's
``router_normalised`` for the families whose router takes it, each family's default where the file leaves it out
(`_NORM_TOPK`).
DeepSeek-V3's and GLM-4.5's multi-token-prediction modules (``num_nextn_predict_layers``) are read as
``mtp_layers`` (`memo_sim.model.config`): priced, and left out of the parameter count, as transformers does not
build them either. A ``quantization_config`` (DeepSeek-V3's fp8
checkpoint) is named there too: memo plans in ``torch_dtype``, FP8 GEMMs being a layout choice.

Sliding windows: Mistral's ``sliding_window`` on every layer, Qwen's ``use_sliding_window`` on the layers from
``max_window_layers`` on. A head dimension other than hidden / heads is read for qwen3, llama and mistral
(Mistral-Small-3.x). A multimodal wrapper whose ``text_config`` is a family memo reads (Mistral-3's mistral,
Llama-4's llama4_text) is read by its ``text_config``, and a model_type of its own whose ``architectures`` is a
family's class (Kimi-K2) as that family (`language_model`), each named in the model's notes; a wrapper whose language
model is not such a family (Gemma-3's ``gemma3_text``: not in `FAMILIES`) is refused naming ``text_config.model_type``.

What memo cannot model is refused with one line naming the field: mixture-of-experts fields in a
dense family, a non-null ``sliding_window`` in a family whose attention does not read it (all but Mistral, Mixtral,
Qwen's and GPT-OSS: `_refuse_window`), cross-attention or
encoder-decoder models, GPT-NeoX's parallel residual, a head dimension other than hidden / heads
in gpt2, gpt_neox or qwen2, biases on the MLP of a gated FFN, an activation it does not know. Boolean fields are
JSON booleans or null (`_flag`: a string "false" is refused, not read as true), ``rope_scaling`` a mapping or null,
``num_key_value_heads`` absent (the family's default), null (multi-head attention) or a whole number >= 1.

A ``head_dim`` the file states is kept for the families that read it (qwen3, llama, mistral and the MoE ones), even
where it is hidden / heads, so that ``--hidden`` keeps the head size as README says. GPT-NeoX's ``rotary_pct``
(0.25 by default) is read as ``rotary_fraction``; GPT-2 has learned positions (``positions`` learned: no rotary op in
its layers), its position table (``wpe``) neither counted nor priced, and named in the model's notes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memo_sim.errors import MemoError
from memo_sim.model.rope import rope_scaling_words
from memo_sim.model.router_groups import router_groups_why_not

# the most multi-token-prediction modules a model may have in memo (DeepSeek-V3 and GLM-4.5 have one; memo's
# `ModelConfig.mtp_layers` takes this bound too)
MAX_MTP_LAYERS = 16
# the longest ``not_modelled`` (the model's notes, `add_note`) memo takes, in characters (`ModelConfig.not_modelled`)
MAX_NOTES = 2000

DENSE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "gpt_neox")
_HEAD_DIM = ("llama", "mistral")  # dense families whose configuration class has head_dim (LlamaConfig, MistralConfig)
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "glm4_moe",
                "llama4_text")
FAMILIES = DENSE_FAMILIES + MOE_FAMILIES
_GATED = ("llama", "mistral", "qwen2", "qwen3")  # gate/up/down MLP: SwiGLU with a SiLU activation
_SILU = ("silu", "swish")
_GELU = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "quick_gelu")
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "bf16": "bf16", "fp16": "fp16",
           "fp32": "fp32", "float": "fp32", "half": "fp16"}
# the families whose attention reads ``sliding_window`` (Mistral and Mixtral on every layer, Qwen's with
# use_sliding_window, GPT-OSS on its sliding layers); `_refuse_window` refuses it in the others
_READS_WINDOW = ("mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss")
_MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")
# the families whose router renormalises its k chosen weights as ``norm_topk_prob`` says (memo's router_normalised;
# each family's default in _DEFAULTS: transformers' configuration classes, Qwen2-MoE's, Qwen3-MoE's and DeepSeek-V2's
# false, DeepSeek-V3's and GLM-4.5's true; DeepSeek-V2's as DeepSeek's own modeling code reads it, transformers'
# port leaving them unnormalised whatever the key). Mixtral and GPT-OSS always renormalise (MixtralSparseMoeBlock;
# GptOssTopKRouter, a softmax over the top-k logits) and Llama 4 never does (its sigmoid): the key is not read there
_NORM_TOPK = ("qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "glm4_moe")

# Each family's defaults for the fields memo reads (transformers' configuration classes). num_key_value_heads: the
# class's default where the key is absent (a review: a Mixtral config without it was read as multi-head attention),
# checked 2026-12-01 in huggingface/transformers: MixtralConfig 8 (configuration_mixtral.py at ad467bd), MistralConfig 8
# (at 001f85b), Qwen2Config 32, Qwen3Config 32, Qwen2MoeConfig 16, Qwen3MoeConfig 4, Llama4TextConfig 8 (at 008e574),
# GptOssConfig 8 (at 02b8f42), Glm4MoeConfig 8 (at 008c726); LlamaConfig's None, the query heads. A null in the file is
# read as the query heads (`_kv_heads`), as the classes' `num_key_value_heads is None` branch does. DeepSeek-V2/V3's
# value is not read: their latent attention gives every head its own keys and values (memo's kv_heads stays unset)
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False},
    "mistral": {"tie_word_embeddings": False, "hidden_act": "silu", "sliding_window": 4096, "num_key_value_heads": 8},
    "qwen2": {"tie_word_embeddings": False, "hidden_act": "silu", "use_sliding_window": False,
              "num_key_value_heads": 32},
    "qwen3": {"tie_word_embeddings": False, "hidden_act": "silu", "use_sliding_window": False, "attention_bias": False,
              "head_dim": 128, "num_key_value_heads": 32},
    "gpt2": {"activation_function": "gelu_new", "n_inner": None, "add_cross_attention": False,
             "tie_word_embeddings": True},
    "gpt_neox": {"tie_word_embeddings": False, "hidden_act": "gelu", "use_parallel_residual": True,
                 "attention_bias": True, "rotary_pct": 0.25},
    "mixtral": {"tie_word_embeddings": False, "hidden_act": "silu", "sliding_window": None, "num_local_experts": 8,
                "num_experts_per_tok": 2, "num_key_value_heads": 8},
    "qwen2_moe": {"tie_word_embeddings": False, "hidden_act": "silu", "use_sliding_window": False,
                  "decoder_sparse_step": 1, "mlp_only_layers": [], "num_experts_per_tok": 4, "num_experts": 60,
                  "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "qkv_bias": True,
                  "norm_topk_prob": False, "num_key_value_heads": 16},
    "qwen3_moe": {"tie_word_embeddings": False, "hidden_act": "silu", "use_sliding_window": False,
                  "decoder_sparse_step": 1, "mlp_only_layers": [], "attention_bias": False, "num_experts_per_tok": 8,
                  "num_experts": 128, "moe_intermediate_size": 768, "norm_topk_prob": False, "num_key_value_heads": 4},
    "deepseek_v2": {"tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
                    "first_k_dense_replace": 0, "moe_layer_freq": 1, "n_shared_experts": None, "scoring_func": "softmax",
                    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                    "v_head_dim": 128, "num_nextn_predict_layers": 0, "topk_method": "greedy", "n_group": None,
                    "topk_group": None, "routed_scaling_factor": 1.0, "norm_topk_prob": False},
    "deepseek_v3": {"tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
                    "first_k_dense_replace": 3, "moe_layer_freq": 1, "n_shared_experts": 1, "scoring_func": "sigmoid",
                    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                    "v_head_dim": 128, "num_nextn_predict_layers": 0, "topk_method": "noaux_tc", "n_group": 8,
                    "topk_group": 4, "routed_scaling_factor": 2.5, "norm_topk_prob": True},
    "gpt_oss": {"tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": True, "num_local_experts": 128,
                "num_experts_per_tok": 4, "sliding_window": 128, "head_dim": 64, "num_key_value_heads": 8},
    # transformers 5.24.0's Glm4MoeConfig (head_dim: hidden / heads where absent, as its attention reads it)
    "glm4_moe": {"tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
                 "moe_intermediate_size": 1408, "num_experts_per_tok": 8, "n_shared_experts": 1,
                 "n_routed_experts": 128, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
                 "first_k_dense_replace": 1, "use_qk_norm": False, "num_nextn_predict_layers": 1,
                 "partial_rotary_factor": 0.5, "norm_topk_prob": True, "num_key_value_heads": 8},
    # transformers 5.24.0's Llama4TextConfig
    "llama4_text": {"tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "head_dim": 128,
                    "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_local_experts": 16,
                    "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "use_qk_norm": True,
                    "attention_chunk_size": 8192, "num_key_value_heads": 8},
}


def is_hf_config(raw: Any) -> bool:
    """Whether a parsed JSON object is a Hugging Face model configuration (not a memo model file)."""
    return isinstance(raw, dict) and ("model_type" in raw or "architectures" in raw)


def config_path(path: str | Path) -> Path:
    """``path`` itself, or the ``config.json`` inside it when it is a folder."""
    p = Path(path)
    return p / "config.json" if p.is_dir() else p


def model_name(f: Path) -> str:
    """The name a model read from ``f`` goes by: its folder's for a config.json, else the file's."""
    return (f.parent.name if f.name == "config.json" and f.parent.name else f.stem).lower() or "hf-model"


# the model classes of the families memo reads, for a config.json whose model_type names a family of its own but
# whose ``architectures`` is one of these (Kimi-K2: model_type kimi_k2, DeepseekV3ForCausalLM)
ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                 "Qwen3ForCausalLM": "qwen3", "GPT2LMHeadModel": "gpt2", "GPTNeoXForCausalLM": "gpt_neox",
                 "MixtralForCausalLM": "mixtral", "Qwen2MoeForCausalLM": "qwen2_moe",
                 "Qwen3MoeForCausalLM": "qwen3_moe", "DeepseekV2ForCausalLM": "deepseek_v2",
                 "DeepseekV3ForCausalLM": "deepseek_v3", "GptOssForCausalLM": "gpt_oss",
                 "Glm4MoeForCausalLM": "glm4_moe", "Llama4ForCausalLM": "llama4_text"}
MODEL_FILE_HINT = ("or write a memo model file: README 'Model files and profiles' lists its fields, the attention "
                   "and mixture-of-experts ones too")


def language_model(raw: dict, source: str = "config.json") -> tuple[dict, str]:
    """The decoder configuration to read from ``raw`` and what reading it so leaves out ("" for ``raw`` itself):

    - a multimodal wrapper (Mistral-3, Llama-4: its own model_type, the language model under ``text_config``)
      gives its ``text_config``, the vision tower and projector named as not modelled, where that language model is
      a family of `FAMILIES`; one that is not (Gemma-3's ``gemma3_text``) is refused in one line naming
      ``text_config.model_type``;
    - a model_type memo does not read whose ``architectures`` is a family's model class (Kimi-K2's
      DeepseekV3ForCausalLM) is read as that family, and said so.

    Otherwise ``raw`` as it is (`hf_model_fields` refuses a family it does not read)."""
    mt = raw.get("model_type")
    if mt in FAMILIES:
        return raw, ""
    text = raw.get("text_config")
    if isinstance(text, dict):
        inner = text.get("model_type")
        if inner not in FAMILIES:
            near = _family_hint(inner)
            raise MemoError(f"{source}: text_config.model_type: {inner!r}: the {mt!r} model's language model is not a "
                            f"family memo reads; {near}it reads {', '.join(FAMILIES)} ({MODEL_FILE_HINT})")
        kept = ("torch_dtype", "dtype", "tie_word_embeddings", "quantization_config")  # the wrapper's, for its text
        merged = {**{k: raw[k] for k in kept if k in raw}, **text}
        others = sorted(k for k, v in raw.items() if k.endswith("_config") and k not in ("text_config",
                                                                                         "quantization_config")
                        and isinstance(v, dict))
        rest = f"its {', '.join(others)} and the projector" if others else "the rest of it"
        return merged, (f"the {mt!r} wrapper's language model (text_config, {inner}) planned alone: {rest} "
                        f"not modelled")
    archs = raw.get("architectures")
    fams = {ARCHITECTURES[a] for a in archs if a in ARCHITECTURES} if isinstance(archs, list) else set()
    if mt is not None and len(fams) == 1:
        fam = fams.pop()
        return {**raw, "model_type": fam}, (f"model_type {mt!r} read as {fam} by its architectures "
                                            f"({', '.join(archs)})")
    return raw, ""


def _family_hint(mt) -> str:
    """``"did you mean 'x'? "`` where ``mt`` is a family spelled another way (separators, case) or mistyped by a letter
    or two dropped or changed, never a digit or an added part: ``llama4``, ``deepseek_v4``, ``glm4v_moe`` or
    ``qwen3_omni_moe`` are other families, not typos of ``llama``, ``deepseek_v3``, ``glm4_moe``, ``qwen3_moe``."""
    key = lambda x: "".join(ch for ch in str(x).lower() if ch.isalnum())  # noqa: E731
    k = key(mt)
    for f in FAMILIES:
        fk = key(f)
        if k == fk:
            return f"did you mean {f!r}? "
        letters_dropped = len(fk) - 2 <= len(k) < len(fk) and _subsequence(k, fk)
        one_letter = (len(k) == len(fk) and sum(a != b for a, b in zip(k, fk)) == 1
                      and all(a == b or (a.isalpha() and b.isalpha()) for a, b in zip(k, fk)))
        if letters_dropped or one_letter:
            return f"did you mean {f!r}? "
    return ""


def _subsequence(short: str, long: str) -> bool:
    it = iter(long)
    return all(ch in it for ch in short)


def hf_model_fields(raw: dict, source: str = "config.json", name: str = "hf-model") -> dict:
    """memo's model fields (`memo_sim.model.config.ModelConfig`; this module builds no
    ModelConfig itself, so `memo_sim.model.config` can import it) for a parsed Hugging Face
    configuration (`with_defaults` applied), or a one-line refusal naming the field."""
    def refuse(field: str, why: str) -> MemoError:
        return MemoError(f"{source}: {field}: {why}")

    mt = raw.get("model_type")
    if mt in MOE_FAMILIES:
        return _with_quantization_note(moe_fields(raw, source, name), raw)
    if mt is None:  # a family is how the fields are read: none guessed
        raise refuse("model_type", f"missing: a Hugging Face config.json names its family; memo reads "
                                   f"{', '.join(FAMILIES)}")
    spelled = str(mt).replace("-", "_").lower()  # 'gpt-oss', 'Qwen3_MoE': the family spelled another way
    if spelled != mt and spelled in FAMILIES:
        raise refuse("model_type", f"{mt!r} is not a family memo reads; did you mean {spelled!r}?")
    if mt not in FAMILIES:
        raise refuse("model_type", f"{mt!r} is not a family memo reads; {_family_hint(mt)}it reads "
                                   f"{', '.join(FAMILIES)} ({MODEL_FILE_HINT})")
    for f in _MOE_FIELDS:
        if raw.get(f):
            raise refuse(f, f"{raw[f]} experts in a {mt!r} configuration: mixture-of-experts layers are read for "
                            f"the families {', '.join(MOE_FAMILIES)}")
    c = {**_DEFAULTS[mt], **raw}
    _refuse_cross_attention(c, refuse)
    _refuse_linear_attention(c, refuse)
    _refuse_window(c, mt, refuse)

    def need(*keys: str) -> int:
        for k in keys:
            v = c.get(k)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise refuse(k, f"must be a positive whole number, got {v!r}")
                return v
        raise refuse(keys[0], "missing; add it (the model's own config.json has it)")

    if mt == "gpt2":
        hidden, layers, heads = need("n_embd", "hidden_size"), need("n_layer", "num_hidden_layers"), need("n_head")
        ffn = c.get("n_inner") or 4 * hidden
        kv, act_field = heads, "activation_function"
    else:
        hidden, layers = need("hidden_size"), need("num_hidden_layers")
        heads, ffn = need("num_attention_heads"), need("intermediate_size")
        kv = _kv_heads(c, heads, refuse)
        act_field = "hidden_act"
    vocab = need("vocab_size")
    act = c.get(act_field)
    gated = mt in _GATED
    if gated and act not in _SILU:
        raise refuse(act_field, f"{act!r} with a gated MLP is not modelled (memo's gated FFN is SwiGLU: silu)")
    if not gated and act not in _GELU:
        raise refuse(act_field, f"{act!r} is not modelled for {mt} (GELU variants: {', '.join(_GELU)})")
    head_dim = c.get("head_dim")
    if mt == "qwen3":  # heads of head_dim whatever hidden / heads is, an RMSNorm over each query and key head
        head_dim = need("head_dim")
    elif mt in _HEAD_DIM and head_dim is not None:  # Mistral-Small-3.x, Mistral-Nemo: 32 heads of 128 in 5120
        head_dim = need("head_dim")
    elif head_dim is not None and head_dim * heads != hidden:
        raise refuse("head_dim", f"{head_dim} x {heads} heads != hidden_size {hidden}: memo's attention "
                                 f"has head_dim = hidden / heads in a {mt} configuration (the families "
                                 f"{', '.join(('qwen3', *_HEAD_DIM))} and the MoE ones read head_dim)")
    sliding = (_qwen_sliding(c, layers, refuse) if mt in ("qwen2", "qwen3")
               else _mistral_sliding(c, layers, refuse) if mt == "mistral" else {})
    if mt == "gpt_neox" and _flag(c, "use_parallel_residual", refuse):
        raise refuse("use_parallel_residual", "true: attention and MLP side by side (parallel residual) "
                                              "is not modelled; memo's layer is sequential pre-norm")
    if _flag(c, "mlp_bias", refuse):
        raise refuse("mlp_bias", "true: biases on a gated MLP are not modelled")
    if mt == "qwen2":
        bias = "qkv"  # Qwen2 always has q/k/v biases, no others
    elif mt in ("llama", "mistral", "qwen3"):
        bias = "all" if _flag(c, "attention_bias", refuse) else "none"  # on q, k, v and o (a SwiGLU FFN has none)
    else:  # GPT-2 and GPT-NeoX: biases on every linear layer
        if mt == "gpt_neox" and not _flag(c, "attention_bias", refuse, default=True):
            raise refuse("attention_bias", "false with MLP biases is not modelled")
        bias = "all"
    dtype, tied = _dtype_and_tied(c, refuse)
    d = dict(name=name, layers=layers, hidden=hidden, heads=heads, ffn=ffn, vocab=vocab,
             kv_heads=None if kv == heads else kv, ffn_type="swiglu" if gated else "gelu", dtype=dtype,
             norm="rmsnorm" if gated else "layernorm", bias=bias, tied_embeddings=tied, **sliding)
    if mt == "qwen3":
        d.update(qk_norm=True)
    if mt == "gpt_neox":  # GPTNeoXAttention turns the first rotary_pct of each head (0.25 by default)
        d.update(_rotary_fraction(c, "rotary_pct", refuse))
    if mt == "gpt2":  # learned positions: no rotary op in the layers (``ModelConfig.positions``)
        d.update(positions="learned")
        add_note(d, f"GPT-2's learned position table (wpe: {c.get('n_positions', 1024)!r} x {hidden}) is neither "
                 f"counted nor priced")
    if head_dim is not None and mt in ("qwen3", *_HEAD_DIM):  # the file's own head size, kept under --hidden
        d.update(head_dim=head_dim)
    d.update(_numerics(c, refuse, moe=False))
    return _with_quantization_note(d, raw)


def _rotary_fraction(c: dict, key: str, refuse) -> dict:
    """``rotary_fraction`` from ``key`` (GLM-4.5's partial_rotary_factor 0.5, GPT-NeoX's rotary_pct 0.25, their
    configuration classes' defaults in _DEFAULTS): the share of each head the rotary embedding turns, which the exports
    write (Megatron's --rotary-percent); none where it is the whole head."""
    prf = c.get(key, 1.0)
    if isinstance(prf, bool) or not isinstance(prf, (int, float)) or not 0 < prf <= 1:
        raise refuse(key, f"must be a share of each head in (0, 1], got {prf!r}")
    return {"rotary_fraction": float(prf)} if prf != 1.0 else {}


def _mistral_sliding(c: dict, layers: int, refuse) -> dict:
    """Mistral's ``sliding_window``: every layer attends to the last ``sliding_window`` tokens (transformers'
    Mistral masks each layer so; Mistral-7B-v0.1's 4096, Ministral-8B's 32768), none where it is null (v0.3)."""
    w = c.get("sliding_window")
    if w is None:
        return {}
    if isinstance(w, bool) or not isinstance(w, int) or w < 1:
        raise refuse("sliding_window", f"must be a positive whole number or null, got {w!r}")
    return {"sliding_window": w, "sliding_layers": layers}


def _qwen_sliding(c: dict, layers: int, refuse) -> dict:
    """Qwen's sliding window: with ``use_sliding_window`` the layers from ``max_window_layers`` on attend to the last
    ``sliding_window`` tokens (transformers' Qwen2/Qwen3 layer types), as memo's ``sliding_layers`` count them; none
    where ``max_window_layers`` reaches the layer count (or the window is off)."""
    if not _flag(c, "use_sliding_window", refuse):
        return {}
    mwl = c.get("max_window_layers")
    if isinstance(mwl, bool) or not isinstance(mwl, int) or mwl < 0:
        raise refuse("max_window_layers", f"must be a whole number >= 0 with use_sliding_window, got {mwl!r}")
    n = max(0, layers - mwl)
    if not n:
        return {}
    w = c.get("sliding_window")
    if isinstance(w, bool) or not isinstance(w, int) or w < 1:
        raise refuse("sliding_window", f"must be a positive whole number with use_sliding_window, got {w!r}")
    return {"sliding_window": w, "sliding_layers": n}


def _numerics(c: dict, refuse, moe: bool) -> dict:
    """The numerics the exports write (`memo_sim.model.config` module docs): the rotary base, the norms' epsilon,
    a MoE router's aux-loss coefficient (read from a MoE family only) and the rotary scaling in words; a field
    the file leaves out stays unstated (0 / ''), the framework's default."""
    for k in ("rope_scaling", "rope_parameters"):  # a string or a number was read as no scaling (a review)
        if c.get(k) is not None and not isinstance(c[k], dict):
            raise refuse(k, f"must be a mapping (rope_type, factor, ...) or null, got {c[k]!r}")
    rp = c.get("rope_parameters") or {}
    keys = {"rope_theta": ("rope_theta", "rotary_emb_base"), "norm_eps": ("rms_norm_eps", "layer_norm_eps",
                                                                          "layer_norm_epsilon"),
            "aux_loss_coef": ("router_aux_loss_coef", "aux_loss_alpha") if moe else ()}
    out: dict = {}
    for field_, names in keys.items():
        for k in names:
            v = c.get(k, rp.get(k))
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise refuse(k, f"must be a number >= 0, got {v!r}")
            out[field_] = float(v)
            break
    if moe and c.get("seq_aux") is not None:  # DeepSeek's per-sequence balance loss
        if not isinstance(c["seq_aux"], bool):
            raise refuse("seq_aux", f"must be true or false, got {c['seq_aux']!r}")
        out["seq_aux"] = c["seq_aux"]
    sc = c.get("rope_scaling") or ({k: v for k, v in rp.items() if k != "rope_theta"}
                                   if rp.get("rope_type") not in (None, "default") else None)
    if isinstance(sc, dict) and (sc.get("rope_type") or sc.get("type")) not in (None, "default"):
        out["rope_scaling"] = rope_scaling_words(str(sc.get("rope_type") or sc.get("type")), sc)
    return out


def _with_quantization_note(d: dict, c: dict) -> dict:
    """``d`` with the file's ``quantization_config`` named in its ``not_modelled``: it says how the
    checkpoint's weights are stored (DeepSeek-V3's fp8 e4m3 in 128 x 128 blocks), not how a run trains,
    so memo plans in the file's torch_dtype and leaves FP8 GEMMs to the layout (``--precision``)."""
    q = c.get("quantization_config")
    if not isinstance(q, dict):
        return d
    what = ", ".join(f"{k} {q[k]}" for k in ("quant_method", "fmt", "weight_block_size") if k in q) or "given"
    note = (f"quantization_config ({what}) describes the checkpoint's stored weights, not the training: memo plans "
            f"{d['dtype']} from torch_dtype, low-precision GEMMs being a layout choice (--precision, e.g. "
            f"fp8-blockwise)")
    return add_note(d, note)


def add_note(d: dict, note: str, first: bool = False) -> dict:
    """``d`` with ``note`` added to its ``not_modelled`` (one sentence of the model's notes each, "; " between them),
    after the others or, ``first``, before them (what a wrapper's config leaves out: its vision tower). Whole notes
    only: the text was cut at 500 characters mid-word and could lose the vision tower's note (a review); a note that
    would take the text past `MAX_NOTES` is left out whole."""
    notes = [x for x in (note, d.get("not_modelled", "")) if x] if first else \
        [x for x in (d.get("not_modelled", ""), note) if x]
    kept = ""
    for x in notes:
        joined = f"{kept}; {x}" if kept else x
        if len(joined) <= MAX_NOTES:
            kept = joined
    d["not_modelled"] = kept
    return d


def _dtype_and_tied(c: dict, refuse) -> tuple[str, bool]:
    """The training dtype (memo's name) and whether the classifier is tied, or a one-line refusal."""
    dt = c.get("torch_dtype") or c.get("dtype") or "bfloat16"
    if dt not in _DTYPES:
        raise refuse("torch_dtype", f"{dt!r} is not a training dtype memo models (bfloat16, float16, float32)")
    tied = c.get("tie_word_embeddings")
    if not isinstance(tied, bool):
        raise refuse("tie_word_embeddings", f"must be true or false, got {tied!r}")
    return _DTYPES[dt], tied


def _whole(c: dict, key: str, refuse, minimum: int = 1) -> int:
    v = c.get(key)
    if v is None:
        raise refuse(key, "missing; add it (the model's own config.json has it)")
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise refuse(key, f"must be a whole number >= {minimum}, got {v!r}")
    return v


def _flag(c: dict, key: str, refuse, default: bool = False) -> bool:
    """A boolean field read strictly: true or false, ``default`` where it is absent or null. A string was read by its
    truthiness (a review: attention_bias "false" added biases, use_sliding_window "false" turned the window on), so
    anything but a JSON boolean is refused, as transformers' configuration classes would type it."""
    v = c.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise refuse(key, f"must be true or false, got {v!r}")
    return v


def _kv_heads(c: dict, heads: int, refuse) -> int:
    """``num_key_value_heads`` (``c`` holds the family's default where the file leaves it out: `_DEFAULTS`): the query
    heads (multi-head attention) where it is null or the family has no default (LlamaConfig's None), else a whole
    number >= 1; 0 was read as absent (a review), a model without K/V heads being no model."""
    if c.get("num_key_value_heads") is None:
        return heads
    return _whole(c, "num_key_value_heads", refuse)


def _top_k_bounds(top_k: int, experts: int, refuse) -> None:
    """The router's k between 1 and the routed experts, named as ``num_experts_per_tok`` in every family."""
    if not 1 <= top_k <= experts:
        raise refuse("num_experts_per_tok", f"{top_k} is not between 1 and the {experts} experts")


def _refuse_cross_attention(c: dict, refuse) -> None:
    """Encoder-decoder or cross-attention configurations (``is_encoder_decoder``, ``add_cross_attention``, strictly
    true or false): memo models decoders only."""
    for fld in ("is_encoder_decoder", "add_cross_attention"):
        if _flag(c, fld, refuse):
            raise refuse(fld, "cross-attention / encoder-decoder models are not modelled (decoder-only)")


# keys of linear-attention layers (Qwen3-Next's gated DeltaNet beside its full-attention layers, MiniMax's lightning
# attention): a config of a family memo reads that carries one is refused, not planned as full attention in silence
# (a review: a Qwen3-Next config relabelled qwen3_moe was read with its 36 linear layers priced as full attention)
_LINEAR_ATTENTION_KEYS = ("full_attention_interval", "linear_num_value_heads", "linear_num_key_heads",
                          "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
                          "linear_attn_config", "attn_type_list")
_ATTENTION_TYPES = ("full_attention", "sliding_attention")


def _refuse_linear_attention(c: dict, refuse) -> None:
    """A linear-attention key (`_LINEAR_ATTENTION_KEYS`), or a ``layer_types`` entry other than full or sliding
    attention: those layers are not modelled."""
    for key in _LINEAR_ATTENTION_KEYS:
        if c.get(key) is not None:
            raise refuse(key, "linear-attention layers (Qwen3-Next's gated DeltaNet, MiniMax's lightning attention) are "
                              "not modelled; memo prices softmax attention, full or sliding-window")
    types = c.get("layer_types")
    if isinstance(types, list):
        other = sorted({t for t in types if isinstance(t, str) and t not in _ATTENTION_TYPES})
        if other:
            raise refuse("layer_types", f"{other[0]!r} layers are not modelled (memo prices "
                                        f"{' and '.join(_ATTENTION_TYPES)})")


def _refuse_window(c: dict, mt: str, refuse) -> None:
    """A ``sliding_window`` in a family whose modelling code does not read it (transformers' Llama, GPT-2, GPT-NeoX,
    DeepSeek, GLM-4.5 and Llama 4 attend over the full causal context whatever the key says): refused rather than
    planned as full attention in silence (a review), as README says."""
    w = c.get("sliding_window")
    if w is not None and mt not in _READS_WINDOW:
        raise refuse("sliding_window", f"{w!r}: sliding-window attention is not read for {mt} (memo reads it for "
                                       f"{', '.join(_READS_WINDOW)}); give null for full attention, or write a memo "
                                       f"model file (sliding_window, sliding_layers)")


def _deepseek_routing(c: dict, d: dict, layers: int, need, refuse, scoring: str, freq: int,
                      groups_on: bool) -> tuple[int, int, int, list[int]]:
    """DeepSeek's routed experts, as DeepSeek-V2/V3 and GLM-4.5 configure them, into ``d`` (router, groups, scaling,
    shared experts, MTP modules): (experts, top_k, expert width, the MoE layers' indices). ``groups_on``: the top-k
    method picks from groups (V2's group_limited_greedy, V3's and GLM's noaux_tc; V2's greedy ignores them)."""
    experts, top_k = need("n_routed_experts"), need("num_experts_per_tok")
    _top_k_bounds(top_k, experts, refuse)  # before the groups' rule, which would name n_group for it (a review)
    expert_ffn = need("moe_intermediate_size")
    shared = c.get("n_shared_experts") or 0
    first = need("first_k_dense_replace", 0)
    if first >= layers:
        raise refuse("first_k_dense_replace", f"{first} leaves no MoE layer of the {layers}; give fewer dense layers")
    moe_at = [i for i in range(layers) if i >= first and i % freq == 0]
    d.update(router=scoring)
    # group-limited routing: each token's experts from its best topk_group of n_group groups
    if groups_on:
        groups = 0 if c.get("n_group") is None else _whole(c, "n_group", refuse)
        group_topk = 0 if c.get("topk_group") is None else _whole(c, "topk_group", refuse)
        if groups > 1 and group_topk:
            why = router_groups_why_not(experts, top_k, groups, group_topk)
            if why:  # the model's rule, said under the config's keys
                raise refuse("n_group", why.replace("router_groups", "n_group").replace("router_group_topk",
                                                                                         "topk_group"))
            d.update(router_groups=groups, router_group_topk=group_topk)
    scaling = c.get("routed_scaling_factor")
    if scaling is not None:
        if isinstance(scaling, bool) or not isinstance(scaling, (int, float)) or not 0 < scaling <= 1e6:
            raise refuse("routed_scaling_factor", f"must be a number above 0, got {scaling!r}")
        d.update(router_scaling=float(scaling))
    if shared:
        d.update(shared_experts=shared, shared_ffn=expert_ffn)
    mtp = 0 if c.get("num_nextn_predict_layers") is None else _whole(c, "num_nextn_predict_layers", refuse, 0)
    if mtp > MAX_MTP_LAYERS:
        raise refuse("num_nextn_predict_layers", f"{mtp} modules: memo models at most {MAX_MTP_LAYERS}")
    if mtp:
        d.update(mtp_layers=mtp)
    return experts, top_k, expert_ffn, moe_at


def _llama4(c: dict, d: dict, layers: int, heads: int, hidden: int, kv: int, need, refuse
            ) -> tuple[int, int, int, list[int]]:
    """Llama 4's text model (transformers' Llama4TextConfig) into ``d``: routed experts of ``intermediate_size`` on
    the ``moe_layers`` (every ``interleave_moe_layer_step``-th), each with a shared expert as wide, a sigmoid over the
    chosen top-k logits; the other layers a dense FFN of ``intermediate_size_mlp``; chunked attention on the rotary
    layers (``no_rope_layers`` 1, every fourth full and without rotary embedding); its QK norm an L2 norm without
    weights (no parameters, not priced). (experts, top_k, expert width, the MoE layers' indices)."""
    experts, top_k, expert_ffn = need("num_local_experts"), need("num_experts_per_tok"), need("intermediate_size")
    moe_at = c.get("moe_layers")
    if moe_at is None:
        step = need("interleave_moe_layer_step")
        moe_at = list(range(step - 1, layers, step))
    if not isinstance(moe_at, list) or not all(isinstance(i, int) and 0 <= i < layers for i in moe_at):
        raise refuse("moe_layers", f"must be a list of layer indices below {layers}, got {moe_at!r}")
    d.update(kv_heads=None if kv == heads else kv, router="sigmoid_topk", shared_experts=1, shared_ffn=expert_ffn,
             ffn=need("intermediate_size_mlp") if len(moe_at) < layers else expert_ffn)
    d["head_dim"] = need("head_dim")  # Llama4TextAttention's own head size, kept under --hidden
    rope = c.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]  # transformers' default
    if not isinstance(rope, list) or len(rope) != layers:
        raise refuse("no_rope_layers", f"must list the {layers} layers (1: rotary and chunked, 0: full), got {rope!r}")
    chunk = c.get("attention_chunk_size")
    chunked = sum(1 for x in rope if x)
    # every N-th layer full attention without rotary embedding, the N - 1 before it rotary (and chunked)
    period = layer_period([not x for x in rope])
    if chunk and chunked:
        d.update(attention_chunk=_whole(c, "attention_chunk_size", refuse), chunked_layers=chunked,
                 chunked_period=period)
    if _flag(c, "use_qk_norm", refuse):
        add_note(d, "QK norm: an L2 norm of the rotary layers' queries and keys, without weights (not priced)")
    if period:
        d["nope_period"] = period
    elif layers - chunked:
        add_note(d, f"no rotary embedding on {layers - chunked} of {layers} layers (NoPE) in no period memo "
                 f"places: not written by the exports")
    return experts, top_k, expert_ffn, moe_at


def layer_period(marked: list[bool]) -> int:
    """N >= 2 where exactly every N-th layer is ``marked`` (the N - 1 before it not), else 0: the one pattern memo's
    ``sliding_period``, ``chunked_period``, ``dense_period`` and ``nope_period`` place (`memo_sim.model.config`)."""
    return next((n for n in range(2, len(marked) + 1)
                 if all(m == ((i + 1) % n == 0) for i, m in enumerate(marked))), 0)


def _dense_period(dense_at: list[int], layers: int) -> int:
    """N >= 2 where the dense-FFN layers ``dense_at`` are every layer but each N-th (Llama 4 Maverick's
    ``interleave_moe_layer_step`` 2, Qwen's ``decoder_sparse_step``), else 0 (the first layers, or no period)."""
    if not dense_at or dense_at == list(range(len(dense_at))):
        return 0
    dense = set(dense_at)
    return layer_period([i not in dense for i in range(layers)])


def _sliding_period(types: list) -> int:
    """N where every N-th layer of ``types`` is full attention and the N - 1 before it slide (GPT-OSS's 2), else 0;
    a type of neither kind: 0."""
    if any(t not in ("full_attention", "sliding_attention") for t in types):
        return 0
    return layer_period([t == "full_attention" for t in types])


def moe_fields(raw: dict, source: str = "config.json", name: str = "hf-model") -> dict:
    """memo's model fields for a mixture-of-experts family (module docs), or a one-line refusal."""
    def refuse(field: str, why: str) -> MemoError:
        return MemoError(f"{source}: {field}: {why}")

    mt = raw["model_type"]
    c = {**_DEFAULTS[mt], **raw}
    _refuse_cross_attention(c, refuse)
    _refuse_linear_attention(c, refuse)
    _refuse_window(c, mt, refuse)
    need = lambda k, lo=1: _whole(c, k, refuse, lo)  # noqa: E731
    hidden, layers, heads = need("hidden_size"), need("num_hidden_layers"), need("num_attention_heads")
    vocab, ffn = need("vocab_size"), need("intermediate_size")
    if c.get("hidden_act") not in _SILU:
        raise refuse("hidden_act", f"{c.get('hidden_act')!r} with a gated MLP is not modelled (SwiGLU: silu)")
    d: dict = dict(name=name, layers=layers, hidden=hidden, heads=heads, ffn=ffn, vocab=vocab, ffn_type="swiglu",
                   norm="rmsnorm", bias="none")
    kv = _kv_heads(c, heads, refuse)
    if mt in ("deepseek_v2", "deepseek_v3"):
        d.update(kv_heads=None, kv_lora_rank=need("kv_lora_rank"), q_lora_rank=c.get("q_lora_rank") or 0,
                 qk_rope_dim=need("qk_rope_head_dim"), head_dim=need("qk_nope_head_dim"), v_head_dim=need("v_head_dim"))
        scoring = c.get("scoring_func")
        if scoring not in ("softmax", "sigmoid"):
            raise refuse("scoring_func", f"{scoring!r}: memo's routers are softmax and sigmoid")
        experts, top_k, expert_ffn, moe_at = _deepseek_routing(c, d, layers, need, refuse, scoring,
                                                               need("moe_layer_freq"),
                                                               c.get("topk_method") in ("group_limited_greedy",
                                                                                        "noaux_tc"))
        if _flag(c, "attention_bias", refuse):
            raise refuse("attention_bias", "true: biases on latent attention are not modelled")
    elif mt == "llama4_text":
        experts, top_k, expert_ffn, moe_at = _llama4(c, d, layers, heads, hidden, kv, need, refuse)
    elif mt == "glm4_moe":  # DeepSeek-V3's routing (sigmoid with a correction bias) beside grouped-query attention
        experts, top_k, expert_ffn, moe_at = _deepseek_routing(c, d, layers, need, refuse, "sigmoid", 1, True)
        d.update(kv_heads=None if kv == heads else kv, qk_norm=_flag(c, "use_qk_norm", refuse),
                 bias="qkv" if _flag(c, "attention_bias", refuse) else "none")  # o never biased (Glm4MoeAttention)
        if c.get("head_dim") is not None:  # the file's own head size, kept under --hidden (a review)
            d["head_dim"] = need("head_dim")
        d.update(_rotary_fraction(c, "partial_rotary_factor", refuse))
    else:
        d.update(kv_heads=None if kv == heads else kv)
        if mt in ("mixtral", "gpt_oss"):
            experts = need("num_local_experts")
            top_k = need("num_experts_per_tok") if "num_experts_per_tok" in c else need("experts_per_token")
            expert_ffn = ffn
            moe_at = list(range(layers))
        else:  # qwen2_moe, qwen3_moe
            experts, top_k, expert_ffn = need("num_experts"), need("num_experts_per_tok"), need("moe_intermediate_size")
            step = need("decoder_sparse_step")
            only = c.get("mlp_only_layers") or []
            if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
                raise refuse("mlp_only_layers", f"must be a list of layer indices, got {only!r}")
            outside = [i for i in only if not 0 <= i < layers]
            if outside:  # transformers builds no such layer: a typo, not a dense layer
                raise refuse("mlp_only_layers", f"index {outside[0]} out of range 0..{layers - 1} (the {layers} "
                                                f"layers of num_hidden_layers); give indices of layers the model has")
            moe_at = [i for i in range(layers) if i not in only and (i + 1) % step == 0]
        if mt == "qwen2_moe":
            if _flag(c, "qkv_bias", refuse, default=True):
                d["bias"] = "qkv"
            sw = need("shared_expert_intermediate_size", 0)
            if sw:
                d.update(shared_experts=1, shared_ffn=sw, shared_gate=True)
        if mt == "qwen3_moe":
            d.update(qk_norm=True)
            if _flag(c, "attention_bias", refuse):
                d["bias"] = "all"
        if mt == "gpt_oss":
            d.update(attention_sinks=True, moe_bias=True, bias="all" if _flag(c, "attention_bias", refuse) else "none")
            limit = c.get("swiglu_limit", 7.0)  # GptOssConfig's default
            if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < limit < float("inf"):
                raise refuse("swiglu_limit", f"must be a positive number (GPT-OSS: 7.0), got {limit!r}")
            d["swiglu_limit"] = float(limit)
            types = c.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention"
                                              for i in range(layers)]
            if not isinstance(types, list) or len(types) != layers:
                raise refuse("layer_types", f"must list the {layers} layers' attention types")
            sliding = sum(1 for t in types if t == "sliding_attention")
            if sliding:
                d.update(sliding_window=need("sliding_window"), sliding_layers=sliding,
                         sliding_period=_sliding_period(types))
        elif mt in ("mixtral",) and c.get("sliding_window") is not None:
            d.update(sliding_window=need("sliding_window"), sliding_layers=layers)
        elif mt in ("qwen2_moe", "qwen3_moe"):
            d.update(_qwen_sliding(c, layers, refuse))
        if c.get("head_dim") is not None:  # the file's own head size, kept under --hidden (a review)
            d["head_dim"] = need("head_dim")
    moe_layers = len(moe_at)
    dense_at = sorted(set(range(layers)) - set(moe_at))
    period = _dense_period(dense_at, layers)
    if period:
        d["dense_period"] = period
    elif dense_at and dense_at != list(range(len(dense_at))):  # neither pattern memo's dense_period places
        where = ", ".join(map(str, dense_at[:6])) + (", ..." if len(dense_at) > 6 else "")
        add_note(d, f"the dense-FFN layers are layers {where}, neither the first {len(dense_at)} nor one MoE layer in "
                 f"every N: memo counts them exactly in the model but places them first in pipeline stages' states "
                 f"(and Megatron's --moe-layer-freq)")
    _top_k_bounds(top_k, experts, refuse)
    if mt in _NORM_TOPK:
        norm = c.get("norm_topk_prob")
        if not isinstance(norm, bool):
            raise refuse("norm_topk_prob", f"must be true or false, got {norm!r}")
        if not norm:
            d["router_normalised"] = False
    if moe_layers == 0:
        raise refuse("num_hidden_layers", "no layer is a MoE layer under this configuration's layer pattern")
    d.update(experts=experts, top_k=top_k, expert_ffn=0 if expert_ffn == d["ffn"] else expert_ffn,
             dense_layers=layers - moe_layers)
    dtype, tied = _dtype_and_tied(c, refuse)
    d.update(dtype=dtype, tied_embeddings=tied, **_numerics(c, refuse, moe=True))
    return d


def with_defaults(f: Path, raw: dict) -> dict:
    """The configuration read from ``f`` with its family's defaults: transformers' AutoConfig's
    when it is installed (local files only), else the JSON as written (`hf_model_fields` fills
    the defaults of the fields it reads)."""
    if raw.get("model_type") in DENSE_FAMILIES:
        try:
            from transformers import AutoConfig  # noqa: PLC0415 - optional, only where installed
        except ImportError:
            return raw
        try:
            full = AutoConfig.for_model(**raw).to_dict()
        except Exception:  # noqa: BLE001 - a file transformers cannot read is still read as JSON
            return raw
        if raw["model_type"] in _HEAD_DIM and "head_dim" not in raw:  # LlamaConfig's hidden / heads, not the file's
            full.pop("head_dim", None)  # own: it follows --hidden, as without transformers
        return {**full, **raw}
    return raw


# memo's model fields and the Hugging Face keys they are read from above, in the order the readers try them, for error
# hints: every field read from a key of its own (a review: an rms_norm_eps of 5 was refused as "norm_eps" alone). Not
# here: the fields read under memo's own name alone (sliding_window, kv_lora_rank, q_lora_rank, v_head_dim, seq_aux,
# swiglu_limit, rope_scaling: the file's key is the field's) and those derived from several keys (bias,
# sliding_layers, chunked_layers, dense_period, nope_period)
HF_KEYS = {"hidden": ("hidden_size", "n_embd"), "heads": ("num_attention_heads", "n_head"),
           "layers": ("num_hidden_layers", "n_layer"), "ffn": ("intermediate_size", "n_inner"),
           "vocab": ("vocab_size",), "kv_heads": ("num_key_value_heads",), "head_dim": ("head_dim", "qk_nope_head_dim"),
           "experts": ("num_local_experts", "num_experts", "n_routed_experts"), "top_k": ("num_experts_per_tok",),
           "expert_ffn": ("moe_intermediate_size",),
           "norm_eps": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"),
           "rope_theta": ("rope_theta", "rotary_emb_base"), "aux_loss_coef": ("router_aux_loss_coef", "aux_loss_alpha"),
           "rotary_fraction": ("partial_rotary_factor", "rotary_pct"), "qk_rope_dim": ("qk_rope_head_dim",),
           "shared_experts": ("n_shared_experts",), "shared_ffn": ("shared_expert_intermediate_size",),
           "dense_layers": ("first_k_dense_replace", "mlp_only_layers"), "router_groups": ("n_group",),
           "router_group_topk": ("topk_group",), "router_scaling": ("routed_scaling_factor",),
           "router_normalised": ("norm_topk_prob",), "mtp_layers": ("num_nextn_predict_layers",),
           "attention_chunk": ("attention_chunk_size",), "qk_norm": ("use_qk_norm",),
           "tied_embeddings": ("tie_word_embeddings",), "dtype": ("torch_dtype", "dtype")}


def hf_names_hint(message: str, raw: dict) -> str:
    """``" (in the config.json: hidden is hidden_size, ...)"`` for the memo fields ``message`` names that the
    configuration holds under their Hugging Face keys ("" where it names none)."""
    import re  # noqa: PLC0415

    named = []
    for memo_name, keys in HF_KEYS.items():
        key = next((k for k in keys if k in raw), None)
        if key and key != memo_name and re.search(rf"\b{memo_name}\b", message):
            named.append(f"{memo_name} is {key}")
    return f" (in the config.json: {', '.join(named)})" if named else ""
