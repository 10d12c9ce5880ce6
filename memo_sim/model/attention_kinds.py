"""Layers whose attention differs: each layer's kind, and a model whose every layer is of one kind.

A model with sliding-window or chunked layers beside full ones (GPT-OSS's sliding layers alternating with full
ones, Llama 4's three chunked layers in four) prices one repeated layer at the layers' mean attention FLOPs
(`ModelConfig.attention_flop_fraction`): exact for a whole model, and for a pipeline stage whose layers hold the
model's mix. A stage holding another mix (Llama-4-Scout's 48 layers over 8 stages of 6: layers 0-5 hold one full
layer, 6-11 two) runs its own layers' attention, so where the placement is stated (``sliding_period`` /
``chunked_period``, or every layer of one kind) the micro-batch pipelines price each layer as its kind
(`memo_sim.engine.schedules.microbatch`, `memo_sim.search.estimate.estimate_pipeline`,
`memo_sim.search.bound.pipeline_iteration_bound`). Where it is not stated (``window_at`` None: some layers slide,
which ones not said) every layer stays at the mean, which `ModelConfig.unplaced_attention_words` names.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from memo_sim.model.config import ModelConfig

Kind = tuple[int, int]  # (sliding window, attention chunk) of a layer: 0 where it attends to every earlier token


@lru_cache(maxsize=1024)
def layer_kinds(model: ModelConfig) -> tuple[Kind, ...]:
    """Each layer's kind where the layers differ and where each lies is stated; () where every layer is priced
    alike (one kind, or the placement not stated)."""
    if not (model.sliding_layers or model.chunked_layers):
        return ()
    kinds = []
    for i in range(model.layers):
        w, c = model.window_at(i), model.chunk_at(i)
        if w is None or c is None:
            return ()
        kinds.append((w, c))
    return tuple(kinds) if len(set(kinds)) > 1 else ()


@lru_cache(maxsize=1024)
def kind_model(model: ModelConfig, kind: Kind) -> ModelConfig:
    """The model with every layer of ``kind``: its attention FLOPs are that layer's (`attention_flop_fraction`)."""
    w, c = kind
    return replace(model, sliding_window=w, sliding_layers=model.layers if w else 0, sliding_period=0,
                   attention_chunk=c, chunked_layers=model.layers if c else 0, chunked_period=0)


def distinct_kinds(model: ModelConfig) -> list[Kind]:
    """The kinds `layer_kinds` finds, in a fixed order."""
    return sorted(set(layer_kinds(model)))


def kinds_of(model: ModelConfig, layers) -> dict[Kind, int]:
    """How many of ``layers`` (model layer indices) are of each kind ({} where the layers are priced alike)."""
    kinds = layer_kinds(model)
    out: dict[Kind, int] = {}
    if kinds:
        for i in layers:
            out[kinds[i]] = out.get(kinds[i], 0) + 1
    return out
