"""A rotary embedding's scaling as ``ModelConfig.rope_scaling`` holds it: in words, one format for every reader
(`memo_sim.model.hf_config` writes it from a config.json's ``rope_scaling``, the exports read it)."""

from __future__ import annotations

# Llama 3.x's rotary scaling (a config's rope_scaling of rope_type llama3) with Meta's released parameters, which
# Megatron-LM's --use-rope-scaling applies fixed (rotary_pos_embedding.py _apply_scaling); `rope_scaling_words`
# leaves them out of the words, so "llama3 factor F" alone means these.
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192.0}


def rope_scaling_words(kind: str, params: dict) -> str:
    """A config's rotary scaling in the words ``ModelConfig.rope_scaling`` holds: its type, its factor, and for
    ``llama3`` the parameters that differ from `LLAMA3_ROPE` (named one by one)."""
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    words = kind + (f" factor {params['factor']:g}" if num(params.get("factor")) else "")
    if kind == "llama3":
        words += "".join(f", {k} {params[k]:g}" for k, std in LLAMA3_ROPE.items()
                         if num(params.get(k)) and float(params[k]) != std)
    if kind == "yarn":  # every parameter stated: DeepSeek-V2-Lite's mscale 0.707 is not V3's 1; others kept as words
        words += "".join(f", {k} {params[k]:g}" for k in YARN_PARAMS if num(params.get(k)))
        words += "".join(f", {k} {params[k]:g}" if num(params[k]) else f", {k} {params[k]}"
                         for k in sorted(params) if k not in (*YARN_PARAMS, "factor", "type", "rope_type")
                         and (num(params[k]) or isinstance(params[k], bool)))
    return words


# YaRN's parameters beside its factor as a config.json's rope_scaling names them
YARN_PARAMS = ("mscale", "mscale_all_dim", "original_max_position_embeddings", "beta_fast", "beta_slow")


def yarn_params(words: str) -> dict[str, float] | None:
    """A YaRN scaling's factor and stated parameters from its words (``"yarn factor 40, mscale 1, ..."``), else
    None."""
    head, _, rest = words.partition("yarn factor ")
    if head or not rest:
        return None
    out = {}
    try:
        for i, part in enumerate(rest.split(", ")):
            key, value = ("factor", part) if i == 0 else part.split(" ", 1)
            out[key] = float(value)
    except ValueError:
        return None
    return out


def llama3_rope_factor(words: str) -> float | None:
    """The factor of a Llama 3.x rotary scaling with `LLAMA3_ROPE`'s parameters (``"llama3 factor 8"``), else None."""
    head, _, factor = words.partition("llama3 factor ")
    if head or not factor:
        return None
    try:
        return float(factor)
    except ValueError:  # other parameters follow the factor
        return None
