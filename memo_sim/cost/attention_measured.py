"""A layer's attention priced from the executor's kernels timed at its shape, where the profile has them.

`memo-exec calibrate` times the attention kernel the executor runs (and ring CP's c x c blocks where
they run another kernel) at a grid of lengths and (heads, head size) pairs, and keeps every case in
the profile (`memo_sim.profile.schema.AttentionTimes`; ``--attention-shapes`` adds the pairs a
model needs). Where one rank's attention has a measured (kernel, heads, head size) and its length
lies between the shortest and the longest measured one, its time is read from those rows,
interpolated log-log between the two measured lengths around it (the time of a kernel whose work
grows as a power of the length, exact at every measured length) and multiplied by the batch (the
executor's kernels loop over the sequences of a batch). Anywhere else -- another shape, a length
outside the measured ones, sliding-window layers, latent attention's unequal head sizes, cuDNN's
fused attention or FlashAttention's Triton kernel where the profile has their own curves -- the efficiency curves price it
(`memo_sim.cost.kernel_time`), as for a profile without the rows. So do the kernels whose shape is not one
the rows describe: SPPO's pieces (queries of one piece against its whole prefix, `memo_sim.cost.sppo`) and
METP's ring blocks (`memo_sim.cost.metp`), in the simulation and in their bounds alike.

The shapes per rank are the executor's: tensor parallelism and Ulysses split the query heads
(heads / (tp·ulysses), each over the whole sequence under Ulysses); ring CP runs 2·cp+1 blocks of
c = s / (2·cp) tokens (`memo_sim.cost.ring_attention.block_counts`: 2·cp-1 full, 2 causal).
"""

from __future__ import annotations

import math
from functools import lru_cache

from memo_sim.cost.ring_attention import block_counts
from memo_sim.layout.ring_merge import ring_merge
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.profile.schema import AttentionTimes, HardwareProfile


@lru_cache(maxsize=256)
def _points(times: AttentionTimes, kernel: str, heads: int, head_dim: int) -> tuple[tuple[int, float, float], ...]:
    return times.points(kernel, heads, head_dim)


def measured_seconds(profile: HardwareProfile, kernel: str, heads: int, head_dim: int, seq: int,
                     phase: str) -> float | None:
    """Seconds of one sequence's ``kernel`` (`ATTENTION_TIME_KERNELS`) at (heads, head_dim, seq) from the
    profile's measured rows (module docs), or None where they do not cover it."""
    times = profile.efficiency.attention_times
    if times is None or seq <= 0:
        return None
    pts = _points(times, kernel, heads, head_dim)
    if not pts or not pts[0][0] <= seq <= pts[-1][0]:
        return None
    col = 2 if phase == "bwd" else 1
    for i, p in enumerate(pts):
        if p[0] == seq:
            return p[col]
        if p[0] > seq:
            lo = pts[i - 1]
            power = math.log(p[col] / lo[col]) / math.log(p[0] / lo[0])
            return lo[col] * (seq / lo[0]) ** power
    return None


def _heads_per_rank(model: ModelConfig, layout: Layout) -> int | None:
    split = layout.tp * layout.ulysses
    if model.heads % split or model.mla or model.qk_head_dim != model.value_head_dim:
        return None
    return model.heads // split


def layer_attention_seconds(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                            phase: str, ring: bool) -> float | None:
    """One rank's attention pass (``phase`` "fwd" or "bwd") of a layer from the measured rows, or None
    (module docs). ``ring``: ring CP's blocks (`memo_sim.cost.ring_attention.applies`)."""
    if profile.efficiency.attention_times is None or model.attention_flop_fraction(seq) < 1.0:
        return None
    if profile.efficiency.priced_attention_kernel(layout.block_kernel if ring else layout.attention) != "flash":
        return None  # the profile describes cuDNN's (or the Triton) kernel apart; the rows timed the executor's own
    heads = _heads_per_rank(model, layout)
    if heads is None:
        return None
    d = model.qk_head_dim
    if ring:
        if ring_merge(layout.ring_merge).step_kernels:
            return None  # one kernel per ring step (TransformerEngine's), not the executor's timed blocks
        c, rem = divmod(seq, 2 * layout.cp)
        full_n, causal_n = block_counts(layout.cp)
        full = measured_seconds(profile, "block_full", heads, d, c, phase)
        causal = measured_seconds(profile, "block_causal", heads, d, c, phase)
        if rem or full is None or causal is None:
            return None
        return batch * (full_n * full + causal_n * causal)
    if layout.cp > 1:
        return None
    t = measured_seconds(profile, "whole", heads, d, seq, phase)
    return None if t is None else batch * t


def pricing_words(model: ModelConfig, layout: Layout, seqs: list[int], profile: HardwareProfile) -> str:
    """How a layer's attention at each of ``seqs`` is priced with ``profile``: from the measured rows or
    the curves, and where a measurement is missing, the calibrate option that adds it (for reports)."""
    if profile.efficiency.attention_times is None:
        return "from the profile's efficiency curves (the profile keeps no timed attention cases)"
    heads = _heads_per_rank(model, layout)
    ring = layout.cp > 1
    shape = f"{heads}x{model.qk_head_dim}" if heads is not None else f"{model.heads}x{model.qk_head_dim}"
    timed, fitted = [], []
    for s in sorted(set(seqs)):
        got = layer_attention_seconds(model, layout, 1, s, profile, "fwd", ring)
        (timed if got is not None else fitted).append(s)
    what = "ring CP's blocks" if ring else "the attention kernel"
    if not fitted:
        return f"{what} at {shape} heads per rank from the profile's timed cases (efficiency.attention_times)"
    where = (f"from the timed cases at {', '.join(map(str, timed))} tokens, " if timed else "")
    return (f"{what} at {shape} heads per rank {where}from the fitted curves at {', '.join(map(str, fitted))} tokens "
            f"(not timed there: memo-exec calibrate --attention-shapes {shape} times the shape, at its grid's lengths)")
