"""Expert tensor parallelism in the MoE block (etp > 1: Megatron-Core's ``--expert-tensor-parallel-size`` under
its alltoall dispatcher, `memo_sim.layout.moe_dispatchers.alltoall`).

The ranks of an ETP group (adjacent stage ranks, `memo_exec.moe.groups`) hold the same local experts, each
a slice of every expert's FFN (`memo_exec.moe.weights`). After the dispatcher has brought each of them its EP
group's copies for those experts (grouped by local expert), `ExpertTP.gather` all-gathers the group's copies
(the simulator's ``moe_dispatch_allgather_etp``), regrouped by local expert (each expert's copies in ETP rank
order), with their router weights; every rank runs all of them through its slice; `ExpertTP.scatter` sums
the partial outputs over the group and hands each rank the rows of its own copies
(``moe_combine_reducescatter_etp``), which the dispatcher's combine sends back. fc1 is column-parallel and
fc2 row-parallel over the slice, and the router weight scales the activation (or, Llama 4's, the gathered input)
row by row, so the sum of the slices' outputs is the whole expert's output.

The ranks hold different numbers of copies: the counts are all-gathered first (an int64 [local experts]
per rank, untimed, as the all-to-all dispatcher's counts exchange), then each rank's rows padded with zero rows
to the group's largest count and gathered with one all-gather; the padding is selected away, and gets a
zero gradient. Both collectives are `memo_exec.moe.comm`'s differentiable ones (the gather's backward a
reduce-scatter, the reduce-scatter's an all-gather, timed under the same names in phase ``bwd``), called in
the same order by every rank of the group.

The allgather dispatcher needs no step here: it gathers over the ETP x EP ranks at once
(`memo_exec.moe.dispatchers.AllGatherDispatcher`, ``gathers_etp``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memo_exec.moe.comm import A2ATag, ep_gather, ep_reduce_scatter
from memo_exec.moe.capacity import sum_copies

ETP_GATHER, ETP_SCATTER = "moe_dispatch_allgather_etp", "moe_combine_reducescatter_etp"  # `memo_sim.cost.moe`


@dataclass
class _Gathered:
    sel: torch.Tensor  # [rows gathered] the padded gathered rows' indices, in the experts' order
    rows: int  # this rank's copies
    padded: int  # every rank's rows after padding
    layer: int | None
    phase: str


class ExpertTP:
    def __init__(self, size: int, rank: int, group) -> None:
        self.size, self.rank, self.group = size, rank, group
        self.timer = None  # a `memo_exec.measure.Recorder`: the two collectives become ep_comm spans

    def _tag(self, op: str, layer: int | None, phase: str) -> A2ATag | None:
        return None if self.timer is None else A2ATag(self.timer, op, layer, phase)

    def gather(self, xe: torch.Tensor, counts: list[int], probs: torch.Tensor, layer: int | None = None,
               phase: str = "fwd") -> tuple[torch.Tensor, list[int], torch.Tensor, _Gathered]:
        """(the group's copies [rows, h] grouped by local expert, their counts per local expert, their router
        weights [rows], the state `scatter` needs) from this rank's ``xe`` [sum(counts), h] and ``probs``."""
        p, dev = self.size, xe.device
        local = torch.tensor(counts, dtype=torch.int64, device=dev).view(1, -1)
        every = ep_gather(local, p, self.group)  # [p, local experts]: rank r's counts in row r
        per_rank = every.sum(1).tolist()
        n, pad = xe.shape[0], max(max(per_rank), 1)
        # padded row t of rank r is gathered row t * p + r; keep the real ones by (local expert, rank, row)
        idx, key = [], []
        for r, c in enumerate(every.tolist()):
            t = torch.arange(per_rank[r], device=dev)
            idx.append(t * p + r)
            key.append(torch.repeat_interleave(torch.arange(len(c), device=dev), torch.tensor(c, device=dev)) * p + r)
        sel = torch.cat(idx).index_select(0, torch.sort(torch.cat(key), stable=True).indices)
        xg = ep_gather(torch.cat([xe, xe.new_zeros(pad - n, xe.shape[1])]), p, self.group,
                       self._tag(ETP_GATHER, layer, phase)).index_select(0, sel)
        pg = ep_gather(torch.cat([probs, probs.new_zeros(pad - n)]).view(-1, 1), p, self.group)
        return xg, every.sum(0).tolist(), pg.view(-1).index_select(0, sel), _Gathered(sel, n, pad, layer, phase)

    def scatter(self, yg: torch.Tensor, state: _Gathered) -> torch.Tensor:
        """This rank's copies' outputs [rows, h]: the group's partial outputs ``yg`` summed over the group."""
        # the outputs at their gathered rows (distinct: a sum of one, keeping only ``sel``), padding rows zero
        full = sum_copies(yg, state.sel, state.padded * self.size)
        return ep_reduce_scatter(full, self.size, self.group, self._tag(ETP_SCATTER, state.layer,
                                                                         state.phase))[:state.rows]
