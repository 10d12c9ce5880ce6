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
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from memo_sim.errors import MemoError, validated
from memo_sim.fileio import read_utf8
from memo_sim.model.hf_config import config_path, hf_model_fields, is_hf_config, model_name, with_defaults
from memo_sim.model.gemm_formats import GEMM_FORMATS, GemmFormat, gemm_format
from memo_sim.model.precision import RECIPES, PrecisionRecipe, default_recipe

FFN_TYPES = ("gelu", "swiglu")
DTYPES = ("bf16", "fp16", "fp32")
NORMS = ("layernorm", "rmsnorm")
BIASES = ("all", "qkv", "none")
# Physical caps: the largest published models have ~130 layers, hidden 25K, vocab 256K; a value
# past these is a typo (1e30 layers would hang the simulator), refused with this range.
MAX_LAYERS = 4096
MAX_HIDDEN = 1 << 18
MAX_HEADS = 1 << 12
MAX_FFN = 1 << 20
MAX_VOCAB = 1 << 24


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
    dtype: Literal[DTYPES] = "bf16"
    precision: Literal[tuple(RECIPES)] | None = None
    norm: Literal[NORMS] = "layernorm"
    bias: Literal[BIASES] = "all"
    tied_embeddings: bool = Field(True, strict=True)
    gemm_format: Literal[GEMM_FORMATS] = "bf16"
    fp8_saved_inputs: bool = Field(False, strict=True)

    @model_validator(mode="after")
    def _shapes(self):
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}); change one of them")
        kv = self.kv_heads if self.kv_heads is not None else self.heads
        if self.heads % kv:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({kv}); change one of them")
        return self


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
    dtype: str = "bf16"
    precision: str | None = None  # model-state recipe (`memo_sim.model.precision`); None: by dtype
    norm: str = "layernorm"  # layernorm | rmsnorm (module docs)
    bias: str = "all"  # which linears carry a bias: all | qkv | none (module docs)
    tied_embeddings: bool = True  # the classifier reuses the token embedding
    gemm_format: str = "bf16"  # the layer GEMMs' number format (`memo_sim.model.gemm_formats`)
    # with a quantised format: the GEMM inputs kept for backward are the quantised copies (TransformerEngine),
    # not the high-precision tensors (torchao's Float8Linear); set by the framework (`Framework.for_model`)
    fp8_saved_inputs: bool = False

    def __post_init__(self) -> None:
        # every way of building a model (presets, files, flags, plans) passes the one validator
        validated(_ModelIn, {f: getattr(self, f) for f in self.__dataclass_fields__}, f"model {self.name}")

    @property
    def recipe(self) -> PrecisionRecipe:
        """The precision recipe: the one named, else fp32 for an fp32 model and Megatron's otherwise."""
        return RECIPES[self.precision or default_recipe(self.dtype)]

    @property
    def gemm(self) -> GemmFormat:
        """The layer GEMMs' format (`memo_sim.model.gemm_formats`)."""
        return gemm_format(self.gemm_format)

    @property
    def gemm_words(self) -> str:
        """'' for GEMMs in the model dtype, else ', GEMMS IN FORMAT' for a one-line summary (MFU
        stays counted against the model dtype's peak)."""
        return f", {self.gemm_format} GEMMs" if self.gemm.quantised else ""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def fc1_width(self) -> int:
        return 2 * self.ffn if self.ffn_type == "swiglu" else self.ffn

    @property
    def norm_params(self) -> int:
        """Weights of one normalisation: scale and shift (LayerNorm) or scale only (RMSNorm)."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    def layer_params(self) -> int:
        """Weights and biases of one layer: QKV, output projection, FFN, two norms."""
        h, f, kv = self.hidden, self.ffn, self.kv_dim
        attn = h * (h + 2 * kv) + h * h
        if self.bias in ("all", "qkv"):
            attn += h + 2 * kv  # QKV bias
        if self.bias == "all":
            attn += h  # output projection bias
        if self.ffn_type == "swiglu":
            ffn = 3 * h * f  # gate, up, down; no biases (LLaMA)
        else:
            ffn = 2 * h * f + (f + h if self.bias == "all" else 0)
        return attn + ffn + 2 * self.norm_params

    def linear_params(self) -> int:
        """Weights of one layer's four linear GEMMs (QKV, output projection, the FFN's), no biases:
        what a quantised GEMM format keeps quantised copies of."""
        h, kv = self.hidden, self.kv_dim
        return h * (h + 2 * kv) + h * h + h * self.fc1_width + self.ffn * h

    def embedding_params(self) -> int:
        """Everything outside the layers: the token embedding, the classifier when it is not tied
        to it, and the final norm."""
        return (1 if self.tied_embeddings else 2) * self.vocab * self.hidden + self.norm_params

    def params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any, source: str = "model") -> "ModelConfig":
        if isinstance(d, dict):
            d = {"name": source, **d}
        m = validated(_ModelIn, d, source)
        return cls(**m.model_dump())


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
    **{name: ModelConfig(name, layers, hidden, heads, ffn, vocab=vocab, kv_heads=kv, ffn_type="swiglu",
                         norm="rmsnorm", bias=bias, tied_embeddings=False)
       for name, layers, hidden, heads, kv, ffn, vocab, bias in (
           ("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, "none"),
           ("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, "none"),
           ("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, "none"),
           ("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, "none"),
           ("llama-3.1-405b", 126, 16384, 128, 8, 53248, 128256, "none"),
           ("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, "qkv"),
           ("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, "qkv"),
           ("mistral-7b", 32, 4096, 32, 8, 14336, 32768, "none"))},
}


def get_model(name: str) -> ModelConfig:
    if name in PRESETS:
        return PRESETS[name]
    p = Path(name)
    if p.suffix in (".json", ".yaml", ".yml") or p.is_dir():
        return model_from_file(p)
    raise MemoError(f"model {name!r} unknown; presets: {', '.join(PRESETS)} (or a .yaml/.json model file, a "
                    f"Hugging Face config.json or its folder, or --layers/--hidden/...)")


def model_from_file(path: str | Path) -> ModelConfig:
    """A model from a memo model file (.yaml/.json with ModelConfig's fields) or a Hugging Face
    config.json (or the folder holding one; `memo_sim.model.hf_config`)."""
    path = config_path(path)
    if not path.exists():
        raise MemoError(f"{path}: no such model file")
    try:
        text = read_utf8(path, MemoError)
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise MemoError(f"{path}: cannot parse model file ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise MemoError(f"{path}: nested too deeply to be a model file; check the file") from None
    if not isinstance(raw, dict):
        raise MemoError(f"{path}: a model file is a mapping of fields (layers, hidden, heads, ffn, vocab)")
    if is_hf_config(raw):
        fields = hf_model_fields(with_defaults(path, raw), source=str(path), name=model_name(path))
        return ModelConfig.from_dict(fields, source=str(path))
    raw.setdefault("name", path.stem)
    if not isinstance(raw["name"], str):
        raw["name"] = str(raw["name"])
    return ModelConfig.from_dict(raw, source=str(path))
