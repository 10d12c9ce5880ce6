"""Token dispatchers by name (``Layout.moe_dispatcher``; ``local`` when ep == 1).

A dispatcher moves each token copy (token t's j-th choice, copy row t*k + j) to the rank holding
its expert and back. ``dispatch(x [T, h], idx [T, k]) -> (xe, counts, state)``: ``xe`` holds the
copies this rank's experts compute, grouped by local expert (``counts[j]`` rows for local expert
j, sources in rank order inside a group); ``combine(ye, state) -> [T*k, h]`` returns the experts'
outputs to their copy rows on the rank the tokens came from. Everything is differentiable
(autograd), the collectives through `memo_exec.moe.comm`.

- ``local``: one process holds every expert: a stable sort of the copies by expert.
- ``alltoall`` (Megatron-Core's ``alltoall`` dispatcher): sort the copies by expert (the experts of
  EP rank r are r*E_local .. (r+1)*E_local - 1, so each destination's copies are contiguous),
  exchange the per-expert counts with one ``all_to_all_single`` of an int64 [ep, E_local] matrix
  (row r to rank r), then the rows with ``all_to_all_single`` and those split sizes, and regroup
  the received rows by local expert; combine runs the inverse permutations and the all-to-all back.
  The counts are exchanged before any row moves, so every rank knows how many rows it receives
  from each peer (zero included: a rank no token is routed to still takes part in both exchanges).
"""

from __future__ import annotations

import torch

from memo_exec.errors import ExecError
from memo_exec.moe.comm import all_to_all, exchange_counts
from memo_sim.registry import Registry

DISPATCHERS: Registry = Registry("layout.moe_dispatcher", error=ExecError,
                                 unknown="{what} {name!r}: the executor runs {known}; plan with moe_dispatcher alltoall")


def _sort_copies(idx: torch.Tensor):
    flat = idx.reshape(-1)
    order = torch.sort(flat, stable=True).indices  # copy rows sorted by expert, copy order among ties
    return flat, order


class Dispatcher:
    name = "base"

    def __init__(self, experts: int, ep: int = 1, ep_rank: int = 0, group=None) -> None:
        self.experts, self.ep, self.ep_rank, self.group = experts, ep, ep_rank, group
        self.local = experts // ep
        self.first = ep_rank * self.local

    def dispatch(self, x: torch.Tensor, idx: torch.Tensor):
        raise NotImplementedError

    def combine(self, ye: torch.Tensor, state) -> torch.Tensor:
        raise NotImplementedError


@DISPATCHERS.register("local")
class LocalDispatcher(Dispatcher):
    def dispatch(self, x, idx):
        k = idx.shape[1]
        flat, order = _sort_copies(idx)
        counts = torch.bincount(flat, minlength=self.experts).tolist()
        return x[order // k], counts, order

    def combine(self, ye, order):
        return ye[torch.argsort(order)]


@DISPATCHERS.register("alltoall")
class AllToAllDispatcher(Dispatcher):
    def dispatch(self, x, idx):
        k, ep, El = idx.shape[1], self.ep, self.local
        flat, order = _sort_copies(idx)
        counts = torch.bincount(flat, minlength=self.experts).view(ep, El)
        recv = exchange_counts(counts, self.group)  # [source rank, local expert]
        in_splits = counts.sum(1).tolist()
        out_splits = recv.sum(1).tolist()
        got = all_to_all(x[order // k], out_splits, in_splits, self.group)
        expert_of = torch.repeat_interleave(torch.arange(El, device=x.device).repeat(ep), recv.reshape(-1).to(x.device))
        regroup = torch.sort(expert_of, stable=True).indices
        return got[regroup], recv.sum(0).tolist(), (order, regroup, in_splits, out_splits)

    def combine(self, ye, state):
        order, regroup, in_splits, out_splits = state
        back = all_to_all(ye[torch.argsort(regroup)], in_splits, out_splits, self.group)
        return back[torch.argsort(order)]


def dispatcher_for(name: str, experts: int, ep: int, ep_rank: int, group) -> Dispatcher:
    return DISPATCHERS.get("local" if ep == 1 else name)(experts, ep, ep_rank, group)
