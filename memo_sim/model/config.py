"""Transformer model configurations: the MEMO paper's GPT presets, LLaMA, GPT-175B, custom."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from memo_sim.errors import MemoError, validated
from memo_sim.fileio import read_utf8
from memo_sim.model.precision import RECIPES, PrecisionRecipe, default_recipe

FFN_TYPES = ("gelu", "swiglu")
DTYPES = ("bf16", "fp16", "fp32")
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

    def __post_init__(self) -> None:
        # every way of building a model (presets, files, flags, plans) passes the one validator
        validated(_ModelIn, {f: getattr(self, f) for f in self.__dataclass_fields__}, f"model {self.name}")

    @property
    def recipe(self) -> PrecisionRecipe:
        """The precision recipe: the one named, else fp32 for an fp32 model and Megatron's otherwise."""
        return RECIPES[self.precision or default_recipe(self.dtype)]

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

    def layer_params(self) -> int:
        """Weights and biases of one layer: QKV, output projection, FFN, two norms."""
        h, f, kv = self.hidden, self.ffn, self.kv_dim
        attn = h * (h + 2 * kv) + (h + 2 * kv) + h * h + h
        if self.ffn_type == "swiglu":
            ffn = 3 * h * f  # gate, up, down; no biases (LLaMA)
        else:
            ffn = 2 * h * f + f + h
        return attn + ffn + 4 * h

    def embedding_params(self) -> int:
        """Token embedding, tied with the classifier (one copy), plus the final norm."""
        return self.vocab * self.hidden + 2 * self.hidden

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
    # LLaMA / LLaMA-2 papers
    "llama-7b": ModelConfig("llama-7b", 32, 4096, 32, 11008, vocab=32000, ffn_type="swiglu"),
    "llama-70b": ModelConfig("llama-70b", 80, 8192, 64, 28672, vocab=32000, kv_heads=8, ffn_type="swiglu"),
}


def get_model(name: str) -> ModelConfig:
    if name in PRESETS:
        return PRESETS[name]
    p = Path(name)
    if p.suffix in (".json", ".yaml", ".yml"):
        return model_from_file(p)
    raise MemoError(f"model {name!r} unknown; presets: {', '.join(PRESETS)} (or a .yaml/.json file, or --layers/--hidden/...)")


def model_from_file(path: str | Path) -> ModelConfig:
    path = Path(path)
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
    raw.setdefault("name", path.stem)
    if not isinstance(raw["name"], str):
        raw["name"] = str(raw["name"])
    return ModelConfig.from_dict(raw, source=str(path))
