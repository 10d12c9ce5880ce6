"""What a training framework offers, so the what-if can answer "what would my framework do".

Each framework names the layouts and activation policies it can run; ``any`` (memo's own
executor and everything it plans) offers them all. What the frameworks offer, as modelled:

- ``megatron`` (Megatron-LM): tensor parallelism with sequence parallelism, context parallelism
  (ring), pipeline parallelism with the 1F1B and the interleaved 1F1B schedules (virtual
  stages), data parallelism with the distributed optimizer (ZeRO-1 semantics) or without;
  full activation recompute or none; no activation offload to host, no Ulysses, no ZeRO-2/3,
  no METP. (Selective recompute is not modelled.)
- ``deepspeed`` (DeepSpeed-Ulysses): Ulysses sequence parallelism with ZeRO (any stage), no
  tensor or ring context parallelism (so no METP); full activation checkpointing or none. (Checkpoint
  offload to host, which keeps only layer inputs on the host, is not modelled; nor is its
  pipeline engine, which does not combine with ZeRO-2/3.)

``schedules``: the schedules (`memo_sim.layout.schedule`) a framework runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout
from memo_sim.layout.schedule import SCHEDULE_NAMES
from memo_sim.policy import policy_names


@dataclass(frozen=True)
class Framework:
    name: str
    summary: str
    policies: tuple[str, ...]
    allows: Callable[[Layout], bool]
    schedules: tuple[str, ...] = ("single_stage",)

    def why_not(self, layout: Layout) -> str | None:
        return None if self.allows(layout) else f"{self.name} does not offer {layout.label()}"


FRAMEWORKS: dict[str, Framework] = {
    "any": Framework("any", "every layout and policy memo plans", policy_names(), lambda lay: True, SCHEDULE_NAMES),
    "megatron": Framework(
        "megatron", "Megatron-LM: TP+SP, ring CP, PP (1F1B, interleaved), DP with the distributed optimizer; "
                    "recompute, no offload",
        ("store_all", "full_recompute"),
        lambda lay: lay.ulysses == 1 and lay.zero <= 1 and (lay.sp or lay.tp == 1) and not lay.metp,
        ("single_stage", "1f1b", "interleaved_1f1b")),
    "deepspeed": Framework(
        "deepspeed", "DeepSpeed-Ulysses: Ulysses sequence parallelism with ZeRO; checkpointing, no offload",
        ("store_all", "full_recompute"),
        lambda lay: lay.tp == 1 and lay.cp == 1 and not lay.metp),
}


def get_framework(name: str) -> Framework:
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise MemoError(f"--framework {name!r} unknown; choose one of {', '.join(FRAMEWORKS)}") from None
