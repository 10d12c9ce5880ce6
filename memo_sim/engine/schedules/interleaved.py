"""``interleaved_1f1b``: Megatron-LM's interleaved one-forward-one-backward schedule.

Each of the p ranks holds v model chunks (virtual stages c·p + s). The m·v chunk steps of a rank
are numbered k = 0 .. m·v - 1; forward step k runs chunk ``(k // p) % v`` of micro-batch
``(k // (p·v))·p + k % p``, backward step k the chunk ``v - 1 - (k // p) % v`` of the same
micro-batch. Rank s runs ``(p - s - 1)·2 + (v - 1)·p`` warm-up forwards (at most all m·v), then
alternates one forward and one backward, then drains (Megatron-LM's
``forward_backward_pipelining_with_interleaving``, `get_pp_rank_microbatches` at d98e8a64; m a multiple of p;
PyTorch's ``ScheduleInterleaved1F1B``, which torchtitan runs, warms up as many). Megatron-LM before 4295be1a6c
(2024-11-01) warmed up all m·v where m = p; memo orders its older versions as today's (the megatron@2021-2023
framework data say so): the last stages then held more chunks in flight. With equal chunk times the bubble is
(p - 1) / (v·m) of the work; a rank holds more chunks' activations in flight than 1F1B (its warm-up is longer),
each 1/v of a stage's. The op graph is
`memo_sim.engine.schedules.microbatch`'s.
"""

from __future__ import annotations

from memo_sim.engine.schedules.microbatch import Step, register_order, simulate_microbatch
from memo_sim.engine.schedules.registry import register_schedule

NAME = "interleaved_1f1b"


def _mb_chunk(k: int, pp: int, vpp: int, forward: bool) -> tuple[int, int]:
    group = k % (pp * vpp)
    chunk = group // pp
    if not forward:
        chunk = vpp - 1 - chunk
    return (k // (pp * vpp)) * pp + k % pp, chunk


def order(pp: int, micro_batches: int, vpp: int, rank: int) -> list[Step]:
    """Rank ``rank``'s chunk steps in Megatron-LM's interleaved order."""
    m = micro_batches
    if m % pp:
        raise ValueError(f"{NAME} needs the micro-batch count ({m}) to be a multiple of pp ({pp})")
    total = m * vpp
    warmup = min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)

    def f(k: int) -> Step:
        mb, c = _mb_chunk(k, pp, vpp, True)
        return Step("F", mb, c)

    def b(k: int) -> Step:
        mb, c = _mb_chunk(k, pp, vpp, False)
        return Step("B", mb, c)

    out = [f(k) for k in range(warmup)]
    for i in range(total - warmup):
        out += [f(warmup + i), b(i)]
    out += [b(total - warmup + i) for i in range(warmup)]
    return out


@register_schedule(NAME)
def simulate_interleaved_1f1b(model, layout, batch, seq, policy, profile, **options):
    return simulate_microbatch(NAME, order, model, layout, batch, seq, policy, profile, **options)


register_order(NAME, order, virtual_stages=True)
