"""Tensor-parallel flavours (``Layout.tp_mode``), one module each, registered by name.

Design. The flavours sit low (level 2, below the model and the layout) and hold data and rules
only, read by attribute from the layout and model they are given: which op groups run as METP
rings (`base.RING_GROUPS`), the tensors that exist only as ring blocks (`memo_sim.model.layer_graph`
marks them not saved), the validity rules and label (`memo_sim.layout.parallel` asks them), MEMO's
recompute scratch (`memo_sim.memplan.trace_gen`) and the rings' communication buffers
(`memo_sim.memplan.iteration_replay`). What a ring group costs and which level-1 blocks it
allocates is written once per group at the level that owns it (`memo_sim.cost.layer_time` with
`memo_sim.cost.metp`, `memo_sim.memplan.ring_trace`), so nothing below asks for a flavour by name.

The flavours, named as the executor's (`memo_exec.distributed.tp`):

- ``megatron`` (`megatron`): Megatron-LM TP, with or without sequence parallelism (``sp``);
- ``metp_ffn`` (`metp_ffn`): METP's ring FFN beside Megatron TP+SP attention;
- ``metp`` (`metp`): METP's ring FFN and two-level MHA;
- ``async_tp`` (`async_tp`): Megatron TP+SP with its collectives decomposed and overlapped with
  their GEMMs (PyTorch's micro-pipeline TP, torchtitan's async TP); no executor flavour (refused).

A new flavour built from the existing ring groups is its module here (imported below) plus its
executor module; a new kind of ring also adds its group's costs and trace blocks.
"""

from __future__ import annotations

from memo_sim.tp import megatron  # noqa: F401  (each module registers its flavour, in this order)
from memo_sim.tp import metp_ffn  # noqa: F401
from memo_sim.tp import metp  # noqa: F401
from memo_sim.tp import async_tp  # noqa: F401
from memo_sim.tp.base import RING_GROUPS, TPFlavour  # noqa: F401  (re-exported)
from memo_sim.tp.registry import FLAVOURS

TP_MODES: tuple[str, ...] = FLAVOURS.names()  # the flavours' names, in registration order


def tp_flavour(name: str) -> TPFlavour:
    """The flavour called ``name`` (a one-line `MemoError` listing the known ones otherwise)."""
    return FLAVOURS.get(name)


def comm_buffer_prefixes() -> tuple[str, ...]:
    """Prefixes of the level-1 buffers any flavour's rings move on their own streams."""
    return tuple(dict.fromkeys(p for n in TP_MODES for p in FLAVOURS.get(n).comm_buffer_prefixes))
