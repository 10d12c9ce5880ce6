"""ZeRO (Rajbhandari et al. 2020; Megatron-LM's distributed optimizer, DeepSpeed): stage 1 shards
the optimizer states over the whole data group, 2 also the gradients, 3 also the weights; under
stage 3 each layer's weights are all-gathered before its forward and again before its backward,
two layers' gathered at a time (the next one's prefetch)."""

from __future__ import annotations

from memo_sim.dp.base import DPFlavour
from memo_sim.dp.registry import DP_FLAVOURS


class Zero(DPFlavour):
    name = "zero"


DP_FLAVOURS.add("zero", Zero())
