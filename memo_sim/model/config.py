"""Transformer model configurations: the MEMO paper's GPT presets, LLaMA, GPT-175B, custom."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from memo_sim.errors import MemoError
from memo_sim.fileio import read_utf8
from memo_sim.model.precision import RECIPES, PrecisionRecipe, default_recipe

FFN_TYPES = ("gelu", "swiglu")


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
        for f in ("layers", "hidden", "heads", "ffn", "vocab"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise MemoError(f"model {self.name}: {f} must be a positive integer, got {v!r}")
        if self.hidden % self.heads:
            raise MemoError(f"model {self.name}: hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        kv = self.kv_heads if self.kv_heads is not None else self.heads
        if kv <= 0 or self.heads % kv:
            raise MemoError(f"model {self.name}: heads ({self.heads}) must be divisible by kv_heads ({kv})")
        if self.dtype not in ("bf16", "fp16", "fp32"):
            raise MemoError(f"model {self.name}: dtype must be bf16, fp16 or fp32, got {self.dtype!r}")
        if self.ffn_type not in FFN_TYPES:
            raise MemoError(f"model {self.name}: ffn_type must be one of {', '.join(FFN_TYPES)}")
        if self.precision is not None and self.precision not in RECIPES:
            raise MemoError(f"model {self.name}: precision must be one of {', '.join(RECIPES)}, got {self.precision!r}")

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
    def from_dict(cls, d: dict, source: str = "model") -> "ModelConfig":
        allowed = set(cls.__dataclass_fields__)
        unknown = set(d) - allowed
        if unknown:
            raise MemoError(f"{source}: unknown model field {sorted(unknown)[0]!r}; known: {', '.join(sorted(allowed))}")
        missing = [f for f in ("layers", "hidden", "heads", "ffn") if f not in d]
        if missing:
            raise MemoError(f"{source}: missing model field {missing[0]!r}")
        d = dict(d)
        d.setdefault("name", source)
        return cls(**d)


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
    if not isinstance(raw, dict):
        raise MemoError(f"{path}: a model file is a mapping of fields (layers, hidden, heads, ffn, vocab)")
    raw.setdefault("name", path.stem)
    return ModelConfig.from_dict(raw, source=str(path))
