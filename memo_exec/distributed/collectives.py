"""The flat-tensor collectives under their current names (torch 2.13 renamed
``all_gather_into_tensor`` / ``reduce_scatter_tensor`` to ``all_gather_single`` /
``reduce_scatter_single`` and warns on the old ones); one place that picks them. `gather_interleaved`: the
sequence-parallel all-gather into the interleaved token order inside its one output (Megatron SP's and the MoE
block's, `memo_exec.distributed.tp.megatron`, `memo_exec.moe.comm`)."""

from __future__ import annotations

import torch
import torch.distributed as dist

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def gather_interleaved(out: torch.Tensor, t: torch.Tensor, p: int, group) -> None:
    """All-gather ``t`` ([n, w], this rank's rows) into ``out`` ([n * p, w]) so that row t*p + j is rank j's row t,
    holding no buffer beside ``out``.

    ``all_gather_into_tensor`` writes rank-major (rank j's n rows together). The rows ``[lo, lo + k)`` of every rank
    land, interleaved, in the contiguous block ``out[lo*p:(lo+k)*p]``; while the local rows ``[lo, n)`` are not yet
    gathered, the block after it (rows ``[lo + k, lo + 2k)``, k <= (n - lo) / 2) is free: the piece is gathered
    rank-major there and copied, transposed, into its own block. A one-row piece is the same rank-major or
    interleaved, and is gathered in place. So the halving takes about log2(n) + 1 collectives of the same total bytes
    as one, and moves the same bytes as the gather-then-reorder it replaces (a review: the rank-major buffer beside
    ``out`` doubled the gathered activation while `memo_sim` prices one full-length buffer). Only data moves:
    gradients are bit-identical."""
    n, w = t.shape
    lo = 0
    while lo < n:
        k = max(1, (n - lo) // 2)
        dest = out[lo * p:(lo + k) * p]
        if k == 1:
            all_gather_single(dest, t[lo:lo + 1], group=group)
        else:
            stage = out[(lo + k) * p:(lo + 2 * k) * p]
            all_gather_single(stage, t[lo:lo + k], group=group)
            dest.view(k, p, w).copy_(stage.view(p, k, w).transpose(0, 1))
        lo += k
