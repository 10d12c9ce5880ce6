"""``megatron``: Megatron-LM's tensor parallelism, column-parallel QKV / fc1 and row-parallel
out_proj / fc2, with its sequence parallelism (``sp``: all-gather before, reduce-scatter after) or
without it (all-reduce after the row-parallel GEMMs, norms and residuals replicated on every TP
rank). The executor's flavour of the same name is `memo_exec.distributed.tp.megatron`. Its rules
and data are the defaults of `memo_sim.tp.base.TPFlavour`."""

from __future__ import annotations

from memo_sim.tp.base import TPFlavour
from memo_sim.tp.registry import FLAVOURS


class Megatron(TPFlavour):
    name = "megatron"


MEGATRON = FLAVOURS.add(Megatron.name, Megatron())
