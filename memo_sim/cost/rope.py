"""The rotary embedding's time on one GPU: the layer graph's ``rope`` op (`memo_sim.model.layer_graph`), run with the
kernels its framework's layers run (``Layout.rope``, `memo_sim.model.rope_kernels`).

The op turns the rank's query heads and its K/V heads (split over TP; a K/V head shared by TP ranks where the ranks
outnumber them, each turning its copy; under latent attention the one rope key every head shares, turned whole on
each rank) over the GPU's tokens (a Ulysses rank turns its sequence shard before the all-to-all, all its TP heads:
the same elements), the rotary share of each head, in the share of the layers that have one. Forward and a
recompute run the kernel's forward, the backward its backward; each kernel is a memory-bound pass priced on the
profile's bandwidth and per-call latency, one per tensor (query and key) for each kernel of the formula.
"""

from __future__ import annotations

from memo_sim.cost.activations import tokens_per_gpu
from memo_sim.cost.kernel_time import memory_bound_op_time
from memo_sim.cost.opcost import OpCost
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES
from memo_sim.model.rope_kernels import rope_counts, rope_kernel, rotary_layer_share, rotary_widths
from memo_sim.profile.schema import HardwareProfile

_TENSORS = 2  # the query and the key heads, each turned by its own kernels


def rope_elements(model: ModelConfig, layout: Layout, batch: int, seq: int) -> float:
    """Elements one GPU's rotary op turns in a layer, averaged over the layers (0 without rotary positions)."""
    share = rotary_layer_share(model)
    if share == 0.0:
        return 0.0
    q, k = rotary_widths(model)
    if model.mla:  # the shared rope key: whole on every TP rank
        k_rank = k
    else:  # the rank's K/V heads, at least one where TP outnumbers them
        k_rank = k / min(layout.tp, model.n_kv_heads)
    return tokens_per_gpu(layout, batch, seq) * (q / layout.tp + k_rank) * share


def rope_cost(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile, phase: str,
              fraction: float = 1.0) -> OpCost:
    """The ``rope`` op's time in ``phase`` (fwd, recompute, bwd) over ``fraction`` of the GPU's tokens; 0 where the
    framework runs no rotary op or the model has none."""
    counts = rope_counts(rope_kernel(layout.rope, layout.kernel_fusion), DTYPE_BYTES[model.dtype])
    elements = rope_elements(model, layout, batch, seq) * fraction
    if counts is None or elements <= 0:
        return OpCost("rope", "elementwise", phase, "compute", 0.0, nbytes=0.0)
    per_element, kernels = counts.phase(phase)
    nbytes = per_element * elements
    return OpCost("rope", "elementwise", phase, "compute", memory_bound_op_time(nbytes, profile, kernels * _TENSORS),
                  nbytes=nbytes)
