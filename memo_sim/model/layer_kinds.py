"""Layers that differ: each layer's kind, and a model whose every layer is of one kind.

Two things set a layer's kind: its attention and its FFN.

Attention: a model with sliding-window or chunked layers beside full ones (GPT-OSS's sliding layers alternating with
full ones, Llama 4's three chunked layers in four) prices one repeated layer at the layers' mean attention FLOPs
(`ModelConfig.attention_flop_fraction`): exact for a whole model, and for a pipeline stage whose layers hold the
model's mix. A stage holding another mix (Llama-4-Scout's 48 layers over 8 stages of 6: layers 0-5 hold one full
layer, 6-11 two) runs its own layers' attention, so where the placement is stated (``sliding_period`` /
``chunked_period``, or every layer of one kind) the micro-batch pipelines price each layer as its kind
(`memo_sim.engine.schedules.microbatch`, `memo_sim.search.estimate.estimate_pipeline`,
`memo_sim.search.bound.pipeline_iteration_bound`). Where it is not stated (``window_at`` None: some layers slide,
which ones not said) every layer stays at the mean, which `ModelConfig.unplaced_attention_words` names.

FFN: a mixture of experts whose ``dense_layers`` keep a dense FFN (DeepSeek's first three, Llama 4 Maverick's and
Qwen's ``decoder_sparse_step`` 2 every other layer: `ModelConfig.dense_layer_at`) runs those layers' FFN as one
dense FFN of width ``ffn``, with no router, no token dispatch and no experts (`ModelConfig.dense_view`); the other
layers run the MoE block. Every schedule prices each layer's time as its kind's: the micro-batch pipelines as
above, the single stage layer by layer (`memo_sim.engine.schedules.single_stage`, its analytic estimate and its
proved bound). A layer's memory terms stay the repeated layer's, the MoE layer's (a review, 2026-12-06: Llama 4
Maverick's 24 dense layers of 48 were priced as MoE layers, their expert all-to-all included).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from memo_sim.model.config import ModelConfig

# (sliding window, attention chunk, dense FFN) of a layer: a window or chunk of 0 where it attends to every earlier
# token, None where the attention stays the model's mean (its placement not stated); dense FFN True for a dense layer
# of a mixture of experts
Kind = tuple[int | None, int | None, bool]


@lru_cache(maxsize=1024)
def layer_kinds(model: ModelConfig) -> tuple[Kind, ...]:
    """Each layer's kind where the layers differ and where each lies is stated; () where every layer is priced
    alike (one kind, or the attention's placement not stated and no dense FFN beside the experts)."""
    ffn = model.mixes_dense_layers
    if not (model.sliding_layers or model.chunked_layers or ffn):
        return ()
    kinds = []
    for i in range(model.layers):
        w, c = model.window_at(i), model.chunk_at(i)
        if w is None or c is None:  # attention at the model's mean on every layer
            if not ffn:
                return ()
            w = c = None
        kinds.append((w, c, model.dense_layer_at(i)))
    return tuple(kinds) if len(set(kinds)) > 1 else ()


@lru_cache(maxsize=1024)
def ffn_kinds(model: ModelConfig) -> tuple[Kind, ...]:
    """Each layer's kind by its FFN alone, the attention at the model's mean on every layer (the single stage's
    kinds: its layers run one after another, so the mean attention is exact for the whole model); () where every
    layer's FFN is alike."""
    if not model.mixes_dense_layers:
        return ()
    return tuple((None, None, model.dense_layer_at(i)) for i in range(model.layers))


@lru_cache(maxsize=1024)
def kind_model(model: ModelConfig, kind: Kind) -> ModelConfig:
    """The model whose repeated layer is of ``kind``: its attention FLOPs are that layer's (`attention_flop_fraction`),
    its FFN the dense one (`ModelConfig.dense_view`) or, for a MoE layer, the model's own (a mixture of experts'
    repeated layer is its MoE layer, whatever dense layers it mixes in: the same op lists, recompute and copies,
    tests/test_moe_dense_layer_kinds.py; so the repeated layer's priced costs serve the MoE layers)."""
    w, c, dense = kind
    if w is not None:
        model = replace(model, sliding_window=w, sliding_layers=model.layers if w else 0, sliding_period=0,
                        attention_chunk=c, chunked_layers=model.layers if c else 0, chunked_period=0)
    return model.dense_view() if dense and model.mixes_dense_layers else model


def distinct_kinds(model: ModelConfig) -> list[Kind]:
    """The kinds `layer_kinds` finds, in a fixed order."""
    return sorted(set(layer_kinds(model)), key=lambda k: (k[0] is None, k[0] or 0, k[1] is None, k[1] or 0, k[2]))


def kinds_of(model: ModelConfig, layers) -> dict[Kind, int]:
    """How many of ``layers`` (model layer indices) are of each kind ({} where the layers are priced alike)."""
    kinds = layer_kinds(model)
    out: dict[Kind, int] = {}
    if kinds:
        for i in layers:
            out[kinds[i]] = out.get(kinds[i], 0) + 1
    return out
