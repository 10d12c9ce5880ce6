"""``1f1b``: PipeDream-flush / Megatron-LM's one-forward-one-backward schedule.

Rank s of p runs ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one
backward until every micro-batch has gone forward, then drains the remaining backwards
(Megatron-LM's ``forward_backward_pipelining_without_interleaving``). It holds up to
``min(p - s, m)`` micro-batches' activations; with equal stage times the bubble is (p - 1) / m of
the work. The op graph is `memo_sim.engine.schedules.microbatch`'s.
"""

from __future__ import annotations

from memo_sim.engine.schedules.microbatch import Step, register_order, simulate_microbatch
from memo_sim.engine.schedules.registry import register_schedule

NAME = "1f1b"


def order(pp: int, micro_batches: int, vpp: int, rank: int) -> list[Step]:
    """Rank ``rank``'s steps: warm-up forwards, steady one-forward-one-backward, cool-down."""
    if vpp != 1:
        raise ValueError(f"{NAME} runs one model chunk per rank, got vpp {vpp}")
    m = micro_batches
    warmup = min(pp - rank - 1, m)
    out = [Step("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        out += [Step("F", warmup + i), Step("B", i)]
    out += [Step("B", m - warmup + i) for i in range(warmup)]
    return out


@register_schedule(NAME)
def simulate_1f1b(model, layout, batch, seq, policy, profile, **options):
    return simulate_microbatch(NAME, order, model, layout, batch, seq, policy, profile, **options)


register_order(NAME, order)
