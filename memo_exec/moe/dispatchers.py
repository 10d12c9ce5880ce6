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

- ``allgather`` (Megatron-Core's ``allgather`` dispatcher, `memo_sim.layout.moe_dispatchers.allgather`): every
  rank's rows, routing and router weights all-gathered over the ETP x EP group (`memo_exec.moe.comm.ep_gather`;
  the EP group when etp is 1), each rank selecting the copies of its local experts (sorted by expert), its
  experts' outputs (under etp > 1 partial: its slice of each expert) put back in a zero buffer of the group's
  copies and reduce-scattered (`ep_reduce_scatter`: each copy's output comes from the ranks computing it, summed
  over their slices); timed as ``moe_dispatch_allgather_etp_ep`` / ``moe_combine_reducescatter_etp_ep`` spans,
  the weights' gather untimed. Its selections are index_select / index_copy, whose
  backwards scatter-add and gather: no regrouping permutation.

- ``deepep`` (DeepEP through Megatron-Core's ``flex`` dispatcher, `memo_sim.layout.moe_dispatchers.deepep`): each
  token goes once to each EP rank holding one of its experts (DeepEP's ``is_token_in_rank``), with its k slots'
  local expert ids there (-1 where a slot's expert is elsewhere) and their router weights; the receiving rank
  expands its rows into their copies by local expert, its experts' weighted outputs are summed per received row
  (`memo_exec.moe.capacity.sum_copies`) and sent back one row per (token, rank), summed per token at the source
  (`Dispatcher.combine_tokens`). Its rows' all-to-alls are timed as the simulator's ``moe_dispatch_alltoall_dedup_ep``
  / ``moe_combine_alltoall_dedup_ep``; the counts' and the slots' exchanges apart. Run with torch's all-to-all
  (NCCL or gloo), not DeepEP's kernels: across nodes a token goes once per rank it reaches, where DeepEP sends it
  once per node and forwards it over NVLink there (what the simulator prices; the executor's inter-node bytes are
  then higher), and its selections are index_select, whose backwards scatter-add.

Router weights (``route_probs``): each copy's weight travels with it (one more all-to-all of one element a
row, in the router's dtype, span ``moe_dispatch_probs_alltoall_ep``, not priced by the simulator), as Megatron-Core's
dispatchers send the permuted probabilities, so the experts apply it inside their activation and the
combine is a plain sum of each token's k copies (nothing h-wide kept for the weights' gradient).

Row moves. Every reordering is a gather by a known permutation (`gather_rows`), whose backward
gathers the output gradient by the inverse permutation (and sums a token's k copies): no
scatter-add. Indexing (``x[order // k]``) would give the same numbers, but autograd's backward of an
index is a sort-based scatter with accumulation, which the simulator's permute (one memory pass)
does not price.

Timing (``alltoall``): with a recorder in ``timer`` (the distributed runner sets it) the rows'
all-to-alls are spans on stream ``ep_comm`` named as the simulator names the dispatcher's steps
(`memo_sim.cost.moe.step_cost`: ``moe_{dispatch|combine}_{collective}_{group}``, so
``moe_dispatch_alltoall_ep`` and ``moe_combine_alltoall_ep``), per layer, in the forward's phase and
in ``bwd`` for their transposes (`memo_exec.moe.comm.all_to_all`); the counts' exchange, which the
simulator does not price, is its own span ``moe_dispatch_counts_alltoall_ep``.
"""

from __future__ import annotations

import torch

from memo_exec.errors import ExecError
from memo_exec.moe.capacity import sum_copies
from memo_exec.moe.comm import A2ATag, all_to_all, ep_gather, ep_reduce_scatter, exchange_counts
from memo_sim.registry import Registry

DISPATCHERS: Registry = Registry("layout.moe_dispatcher", error=ExecError,
                                 unknown="{what} {name!r}: the executor runs {known}; plan with moe_dispatcher "
                                         "alltoall or allgather")


def sim_op_name(which: str, collective: str = "alltoall", group: str = "ep") -> str:
    """The simulator's name of a dispatcher step (`memo_sim.cost.moe.step_cost`)."""
    return f"moe_{which}_{collective}_{group}"


DISPATCH_A2A, COMBINE_A2A = sim_op_name("dispatch"), sim_op_name("combine")
COUNTS_A2A = "moe_dispatch_counts_alltoall_ep"  # not priced by the simulator
PROBS_A2A = "moe_dispatch_probs_alltoall_ep"  # the copies' router weights (one element a row): not priced either


def _sort_copies(idx: torch.Tensor):
    flat = idx.reshape(-1)
    order = torch.sort(flat, stable=True).indices  # copy rows sorted by expert, copy order among ties
    return flat, order


def inverse(perm: torch.Tensor) -> torch.Tensor:
    """The inverse of a permutation of range(n): ``inverse(p)[p[i]] == i``."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device, dtype=perm.dtype)
    return inv


class _GatherRows(torch.autograd.Function):
    """``out[i] = x[perm[i] // k]`` for a permutation ``perm`` of range(len(x) * k); backward:
    ``dx[t] = sum_j dout[inv[t*k + j]]`` (a gather and, for k > 1, a sum over each row's copies)."""

    @staticmethod
    def forward(ctx, x, perm, inv, k):
        ctx.save_for_backward(inv)
        ctx.k, ctx.n = k, x.shape[0]
        return x.index_select(0, perm // k if k > 1 else perm)

    @staticmethod
    def backward(ctx, g):
        (inv,) = ctx.saved_tensors
        gx = g.index_select(0, inv)
        if ctx.k > 1:
            gx = gx.view(ctx.n, ctx.k, *g.shape[1:]).sum(1)
        return gx, None, None, None


def gather_rows(x: torch.Tensor, perm: torch.Tensor, k: int = 1, inv: torch.Tensor | None = None) -> torch.Tensor:
    """Rows ``x[perm // k]`` (``perm`` a permutation of range(len(x) * k): each row of ``x`` taken k
    times), differentiable with a gather for its backward (module docs)."""
    return _GatherRows.apply(x, perm, inverse(perm) if inv is None else inv, k)


class Dispatcher:
    name = "base"
    gathers_etp = False  # its own collectives cover the ETP ranks (no ETP step around the experts, `memo_exec.moe.etp`)

    def __init__(self, experts: int, ep: int = 1, ep_rank: int = 0, group=None) -> None:
        self.experts, self.ep, self.ep_rank, self.group = experts, ep, ep_rank, group
        self.local = experts // ep
        self.first = ep_rank * self.local
        self.timer = None  # a `memo_exec.measure.Recorder`: the collectives become ep_comm spans

    def tag(self, op: str, layer: int | None, phase: str) -> A2ATag | None:
        return None if self.timer is None else A2ATag(self.timer, op, layer, phase)

    def dispatch(self, x: torch.Tensor, idx: torch.Tensor, layer: int | None = None, phase: str = "fwd"):
        raise NotImplementedError

    def combine(self, ye: torch.Tensor, state) -> torch.Tensor:
        raise NotImplementedError

    def combine_tokens(self, ye: torch.Tensor, state, tokens: int, k: int) -> torch.Tensor:
        """Each of the ``tokens`` rows' k copies' outputs summed: [tokens, h]."""
        return self.combine(ye, state).view(tokens, k, ye.shape[1]).sum(1)

    def route_probs(self, probs: torch.Tensor, state) -> torch.Tensor:
        """The copies' router weights ``probs`` [T, k] sent where `dispatch` sent the copies (its ``state``),
        in ``xe``'s row order: [rows of xe], differentiable (the experts apply them, `memo_exec.moe.experts`)."""
        raise NotImplementedError


@DISPATCHERS.register("local")
class LocalDispatcher(Dispatcher):
    def dispatch(self, x, idx, layer=None, phase="fwd"):
        k = idx.shape[1]
        flat, order = _sort_copies(idx)
        counts = torch.bincount(flat, minlength=self.experts).tolist()
        inv = inverse(order)
        return gather_rows(x, order, k, inv), counts, (order, inv)

    def combine(self, ye, state):
        order, inv = state
        return gather_rows(ye, inv, 1, order)

    def route_probs(self, probs, state):
        order, inv = state
        return gather_rows(probs.reshape(-1, 1), order, 1, inv).view(-1)


@DISPATCHERS.register("alltoall")
class AllToAllDispatcher(Dispatcher):
    def dispatch(self, x, idx, layer=None, phase="fwd"):
        k, ep, El = idx.shape[1], self.ep, self.local
        flat, order = _sort_copies(idx)
        counts = torch.bincount(flat, minlength=self.experts).view(ep, El)
        recv = exchange_counts(counts, self.group, self.tag(COUNTS_A2A, layer, phase))  # [source rank, local expert]
        in_splits = counts.sum(1).tolist()
        out_splits = recv.sum(1).tolist()
        inv = inverse(order)
        got = all_to_all(gather_rows(x, order, k, inv), out_splits, in_splits, self.group,
                         self.tag(DISPATCH_A2A, layer, phase))
        expert_of = torch.repeat_interleave(torch.arange(El, device=x.device).repeat(ep), recv.reshape(-1).to(x.device))
        regroup = torch.sort(expert_of, stable=True).indices
        un_regroup = inverse(regroup)
        return (gather_rows(got, regroup, 1, un_regroup), recv.sum(0).tolist(),
                (order, inv, regroup, un_regroup, in_splits, out_splits, layer, phase))

    def combine(self, ye, state):
        order, inv, regroup, un_regroup, in_splits, out_splits, layer, phase = state
        back = all_to_all(gather_rows(ye, un_regroup, 1, regroup), in_splits, out_splits, self.group,
                          self.tag(COMBINE_A2A, layer, phase))
        return gather_rows(back, inv, 1, order)

    def route_probs(self, probs, state):
        order, inv, regroup, un_regroup, in_splits, out_splits, layer, phase = state
        got = all_to_all(gather_rows(probs.reshape(-1, 1), order, 1, inv), out_splits, in_splits, self.group,
                         self.tag(PROBS_A2A, layer, phase))
        return gather_rows(got, regroup, 1, un_regroup).view(-1)


AG_DISPATCH, AG_COMBINE = sim_op_name("dispatch", "allgather", "etp_ep"), sim_op_name("combine", "reducescatter",
                                                                                      "etp_ep")


@DISPATCHERS.register("allgather")
class AllGatherDispatcher(Dispatcher):
    """Megatron-Core's ``allgather`` dispatcher (module docs): every rank's tokens and routing all-gathered over the
    ETP x EP group (``gather`` ranks: etp x ep, ETP innermost; the EP group when etp is 1), each rank computing the
    copies routed to its local experts on its slice of them, the outputs reduce-scattered back (each copy's output
    on exactly one EP coordinate's ranks, summed over their ETP slices; zeros elsewhere)."""
    gathers_etp = True

    def __init__(self, experts: int, ep: int = 1, ep_rank: int = 0, group=None, gather: int | None = None) -> None:
        super().__init__(experts, ep, ep_rank, group)
        self.gather = gather or ep

    def dispatch(self, x, idx, layer=None, phase="fwd"):
        k, ep = idx.shape[1], self.gather
        xs = ep_gather(x, ep, self.group, self.tag(AG_DISPATCH, layer, phase))  # [ep*T, h]: row t*ep + r, rank r's
        flat = ep_gather(idx, ep, self.group).reshape(-1)  # the gathered tokens' copies, token g's at g*k ..
        mine = ((flat >= self.first) & (flat < self.first + self.local)).nonzero().squeeze(1)
        sel = mine[torch.sort(flat[mine], stable=True).indices]  # this rank's copies, grouped by local expert
        counts = torch.bincount(flat[sel] - self.first, minlength=self.local).tolist()
        return xs.index_select(0, sel // k), counts, (sel, flat.numel(), k, layer, phase)

    def combine(self, ye, state):
        sel, n, k, layer, phase = state
        h = ye.shape[1]
        # its outputs at their copies' rows (distinct: a sum of one), keeping only ``sel`` for the backward
        full = sum_copies(ye, sel, n).view(n // k, k * h)
        return ep_reduce_scatter(full, self.gather, self.group, self.tag(AG_COMBINE, layer, phase)).view(-1, h)

    def route_probs(self, probs, state):
        sel = state[0]  # the weights gathered untimed (the simulator prices the rows' collectives only)
        return ep_gather(probs, self.gather, self.group).reshape(-1).index_select(0, sel)


DEDUP_DISPATCH, DEDUP_COMBINE = sim_op_name("dispatch", "alltoall_dedup"), sim_op_name("combine", "alltoall_dedup")
DEDUP_SLOTS = "moe_dispatch_slots_alltoall_ep"  # the slots' local expert ids and weights: not priced
# the rows' all-to-alls `memo_exec.compare.alltoall_rows` compares (the alltoall dispatcher's and DeepEP's)
A2A_OPS = (DISPATCH_A2A, COMBINE_A2A, DEDUP_DISPATCH, DEDUP_COMBINE)


@DISPATCHERS.register("deepep")
class DedupDispatcher(Dispatcher):
    """DeepEP's deduplicated dispatch (module docs): a token once per EP rank holding one of its experts."""

    def dispatch(self, x, idx, layer=None, phase="fwd"):
        ep, El, k = self.ep, self.local, idx.shape[1]
        dest = idx // El  # [T, k] the rank of each slot's expert
        hit = torch.zeros(idx.shape[0], ep, dtype=torch.bool, device=idx.device).scatter_(1, dest, True)
        rank_of, token_of = hit.t().nonzero(as_tuple=True)  # (rank, token) pairs, by rank then token
        mine = dest.index_select(0, token_of) == rank_of.unsqueeze(1)  # [P, k] the slots on the pair's rank
        slots = torch.where(mine, idx.index_select(0, token_of) - rank_of.unsqueeze(1) * El, -1)
        send = hit.sum(0).to(torch.int64).view(ep, 1)
        recv = exchange_counts(send, self.group, self.tag(COUNTS_A2A, layer, phase))
        in_splits, out_splits = send.view(-1).tolist(), recv.view(-1).tolist()
        got = all_to_all(x.index_select(0, token_of), out_splits, in_splits, self.group,
                         self.tag(DEDUP_DISPATCH, layer, phase))
        got_slots = all_to_all(slots, out_splits, in_splits, self.group, self.tag(DEDUP_SLOTS, layer, phase))
        row, slot = (got_slots >= 0).nonzero(as_tuple=True)  # this rank's copies: (received row, slot)
        local = got_slots[row, slot]
        order = torch.sort(local, stable=True).indices  # grouped by local expert, received order inside
        row, slot = row[order], slot[order]
        counts = torch.bincount(local, minlength=El).tolist()
        return (got.index_select(0, row), counts,
                (token_of, mine, in_splits, out_splits, row, slot, got.shape[0], idx.shape[0], k, layer, phase))

    def combine(self, ye, state):
        """One row per (token, rank) pair this rank sent, in the pairs' order: the rank's experts' weighted outputs
        for the token, summed there (`combine_tokens` sums a token's pairs; not the copies' [T*k, h])."""
        token_of, mine, in_splits, out_splits, row, slot, n_got, T, k, layer, phase = state
        per_row = sum_copies(ye, row, n_got)  # each received row's copies, weighted inside the experts
        return all_to_all(per_row, in_splits, out_splits, self.group, self.tag(DEDUP_COMBINE, layer, phase))

    def combine_tokens(self, ye, state, tokens, k):
        return sum_copies(self.combine(ye, state), state[0], tokens)  # a token's sums from every rank it reached

    def route_probs(self, probs, state):
        token_of, mine, in_splits, out_splits, row, slot, n_got, T, k, layer, phase = state
        w = probs.index_select(0, token_of) * mine.to(probs.dtype)  # [P, k] the weights of the pair's slots
        got = all_to_all(w, out_splits, in_splits, self.group, self.tag(PROBS_A2A, layer, phase))
        return got[row, slot]


def dispatcher_for(name: str, experts: int, groups) -> Dispatcher:
    """The layout's dispatcher over a rank's `memo_exec.moe.groups.ExpertGroups`: ``local`` where the rank's
    experts see its own rows only (ep 1, and no ETP x EP gather), the allgather dispatcher over the ETP x EP group."""
    g = groups
    if name == "allgather" and g.ep * g.etp > 1:
        return AllGatherDispatcher(experts, g.ep, g.ep_rank, g.etp_ep_group, gather=g.ep * g.etp)
    return DISPATCHERS.get("local" if g.ep == 1 else name)(experts, g.ep, g.ep_rank, g.ep_group)
