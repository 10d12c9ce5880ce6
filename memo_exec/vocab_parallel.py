"""The embedding and the classifier split over the TP group by vocabulary rows, as Megatron-LM runs them
(VocabParallelEmbedding, a column-parallel output layer, vocab_parallel_cross_entropy) and the simulator prices
them (`memo_sim.cost.memory`: "TP divides everything, the embedding/classifier too"; `memo_sim.cost.boundary`:
the classifier at vocab / tp).

The vocabulary is padded to a multiple of 128 x tp (`memo_exec.model.padded_vocab`); TP rank r holds rows
[r Vp/tp, (r+1) Vp/tp) of the embedding ``wte`` and of an untied classifier ``lm_head`` (`VocabSplit`), drawn
whole from the one-process generator sequence and sliced (`memo_exec.model._init_rows_`), so every layout starts
from the one-process weights. The padding rows stay zero and out of the loss.

- Embedding (`VocabSplit.embed`): the TP group's tokens (with sequence parallelism all-gathered, in the
  interleaved order of `memo_exec.distributed.context.local_token_index`: gathered row t*p + j is rank j's local
  row t) looked up in this rank's rows, the others' rows zero, then summed over the group: an all-reduce without
  SP (its backward the identity: every rank has the same gradient), a reduce-scatter to this rank's rows with SP
  (its backward the all-gather). Either way the shard's gradient is complete on its rank.
- Classifier and loss (`memo_exec.model.ChunkedHead` with ``split``): with SP the final-normed rows, targets
  and row weights of the TP group all-gathered first; each chunk's logits of this rank's rows, its log-sum-exp
  and the target logit (from the rank that holds the target's row) combined over the group in one all-gather;
  ``d_hf`` reduce-scattered back to this rank's rows (SP) or all-reduced (every rank has every row). The
  returned loss is this rank's rows' part (SP: the ranks' parts sum to the one-process loss over the ``tokens``
  group) or, without SP, every row's, as every TP rank reported before.

The collectives are blocking (no wait site) and use the TP group's helpers of the MoE block and the
multi-token-prediction modules (`memo_exec.moe.comm`, `memo_exec.mtp`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from memo_exec.distributed.collectives import all_gather_single
from memo_exec.model import GPT, padded_vocab, vocab_rows
from memo_exec.moe.comm import _gather, _reduce_scatter, sp_reduce_scatter
from memo_exec.mtp import _SumOut


class VocabSplit:
    """TP rank ``rank`` of ``size``'s rows of a ``vocab``-token vocabulary (``group``: the TP group; ``sp``: the
    tokens split over it, Megatron's sequence parallelism or a METP flavour)."""

    def __init__(self, vocab: int, size: int, rank: int, group, sp: bool) -> None:
        self.vocab, self.size, self.rank, self.group, self.sp = vocab, size, rank, group, sp
        self.rows = vocab_rows(vocab, size)
        self.start = rank * self.rows

    @classmethod
    def of(cls, flavour, ctx, vocab: int) -> VocabSplit | None:
        """The split of a distributed executor's TP flavour (None: one TP rank holds every row)."""
        if flavour.size == 1:
            return None
        return cls(vocab, flavour.size, flavour.rank, flavour.group, bool(ctx.sp_tokens))

    # ------------------------------------------------------------------ embedding
    def _tokens(self, t: torch.Tensor) -> torch.Tensor:
        """The TP group's values of a per-row vector ``t`` (this rank's rows with SP: gathered, interleaved)."""
        return _gather(t.reshape(-1, 1), self.size, self.group).view(-1) if self.sp else t.reshape(-1)

    def embed(self, inputs: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Embedding rows of ``inputs`` (this rank's rows) from this rank's vocabulary rows ``w`` (autograd)."""
        local = self._tokens(inputs) - self.start
        miss = (local < 0) | (local >= self.rows)
        x = F.embedding(local.masked_fill(miss, 0), w).masked_fill(miss.unsqueeze(1), 0.0)
        x = sp_reduce_scatter(x, self.size, self.group) if self.sp else _SumOut.apply(x, self.group)
        return x.view(*inputs.shape, w.shape[1])

    # ------------------------------------------------------------------ classifier (`ChunkedHead`)
    def rows_in(self, hf: torch.Tensor, targets: torch.Tensor, row_weights: torch.Tensor | None):
        """The classifier's rows, targets and row weights of the TP group, and which rows' loss is this rank's
        (None: every row's)."""
        if not self.sp:
            return hf, targets, row_weights, None
        hf = _gather(hf, self.size, self.group)
        targets = self._tokens(targets)
        row_weights = None if row_weights is None else self._tokens(row_weights)
        own = torch.arange(hf.shape[0], device=hf.device) % self.size == self.rank
        return hf, targets, row_weights, own

    def lse_nll(self, lf: torch.Tensor, tc: torch.Tensor):
        """A chunk's log-sum-exp and loss per row over the whole vocabulary from this rank's logits ``lf``
        [rows, Vp/tp] (padding masked) and the targets ``tc``; and where this rank's logits hold each target
        (column, whether held) for the gradient."""
        idx = tc - self.start
        hit = (idx >= 0) & (idx < lf.shape[1])
        at = idx.clamp(0, lf.shape[1] - 1).unsqueeze(1)
        mine = torch.stack([torch.logsumexp(lf, dim=-1), torch.where(hit, lf.gather(1, at).squeeze(1), 0.0)])
        parts = mine.new_empty(self.size * 2, mine.shape[1])
        all_gather_single(parts, mine, group=self.group)
        parts = parts.view(self.size, 2, -1)
        lse = torch.logsumexp(parts[:, 0], dim=0)
        return lse, lse - parts[:, 1].sum(0), at, hit

    def rows_out(self, d_hf: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the gradient of the classifier's input: the ranks' partial sums summed."""
        if self.sp:
            return _reduce_scatter(d_hf, self.size, self.group)
        dist.all_reduce(d_hf, group=self.group)
        return d_hf

    # ------------------------------------------------------------------ checks
    def whole(self, named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``named`` (the first unit's tensors by parameter name) with the embedding's and the classifier's rows
        gathered over the TP group, as one process holds them (`padded_vocab` rows; a collective)."""
        out = dict(named)
        for name in GPT.VOCAB_ROWS:
            if name in named:
                t = named[name].contiguous()
                parts = t.new_empty(self.size * t.shape[0], *t.shape[1:])
                all_gather_single(parts, t, group=self.group)
                out[name] = parts[:padded_vocab(self.vocab)]
        return out
