"""The K/V cache of one pipeline stage and the autograd function that attends through it.

SPPO's first level of activation management (papers/sppo.txt sec. 5.1): the K and V of every
subsequence (piece) but the stage's last stay on the device from its forward until its own backward,
because every later piece attends to them in forward and adds to their gradients in backward ("K_i and
V_i need to participate in the following Q_N computation, where i < N"). The stage's last piece's K/V
is read by its own attention only (forward and backward): it is an ordinary activation of that piece,
saved through autograd (``ctx.save_for_backward``) so that the piece's offload unit
(`memo_exec.sppo.offload`) moves alpha_i of its rows to host with the piece's other activations and
prefetches them for its backward, as the simulator prices it (`memo_sim.policy.sppo`: ``cached_kv`` is
``k < n_k - 1`` in `memo_sim.memplan.footprint.sppo_host_stages` and the ``sppo`` schedule). Its chunk
is in the cache only while its forward attends (the cache then keeps a ``None`` marker, so the order
checks below still see the piece).

`KVCache` holds, per layer of the stage, each piece's K and V chunk (token-major ``[b, n, kv]``)
and the dK/dV accumulators of the pieces whose gradient later pieces have started to add to
(allocated by the first backward that touches them, in the model dtype, as the simulator counts
them; freed with the piece's own backward).

`PrefixAttention` (a `torch.autograd.Function`), for piece ``k`` covering tokens ``[a, a + n)``:

- forward: store this piece's K/V chunk in the cache, concatenate the cache's chunks of pieces
  ``0..k-1`` (tokens ``[0, a)``) with it, and attend the piece's queries to the ``a + n`` keys
  with the causal mask at offset ``a`` (`memo_exec.sppo.attention`); only q, the output and the
  lse are saved (K/V live in the cache, not twice), except for the stage's last piece, whose K/V
  chunk is saved with q and the output and leaves the cache (`KVCache.hand_over`);
- backward: concatenate again (the last piece: the cache's chunks with its saved own chunk), compute
  dq, dK, dV over ``[0, a + n)``; the rows of the earlier
  pieces go into their accumulators, and the piece's own rows plus its accumulator (what every
  later piece added) are the gradient of its K/V chunk. Pieces must therefore run backward in
  reverse order: a piece's backward raises if a later piece of the same layer has not yet run its
  backward (its contribution would be missing), and its chunk is dropped afterwards.
"""

from __future__ import annotations

import torch

from memo_exec.errors import ExecError
from memo_exec.sppo.attention import prefix_attention_backward, prefix_attention_forward


class KVCache:
    """K/V chunks and dK/dV accumulators of one stage, per (layer, piece)."""

    def __init__(self, layers: int, starts: list[int], ends: list[int], heads: int, kv_heads: int,
                 head_dim: int) -> None:
        self.layers = layers
        self.starts, self.ends = list(starts), list(ends)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.k: list[dict[int, torch.Tensor]] = [{} for _ in range(layers)]
        self.v: list[dict[int, torch.Tensor]] = [{} for _ in range(layers)]
        self.dk: list[dict[int, torch.Tensor]] = [{} for _ in range(layers)]
        self.dv: list[dict[int, torch.Tensor]] = [{} for _ in range(layers)]
        self.peak_bytes = 0

    def reset(self) -> None:
        for d in self.k + self.v + self.dk + self.dv:
            d.clear()

    def nbytes(self) -> int:
        """Device bytes the cache holds (a handed-over chunk is autograd's, not the cache's)."""
        return sum(t.numel() * t.element_size() for d in self.k + self.v + self.dk + self.dv for t in d.values()
                   if t is not None)

    def is_last(self, piece: int) -> bool:
        """Whether ``piece`` is the stage's last: no later piece reads its K/V (module docs)."""
        return piece == len(self.starts) - 1

    def hand_over(self, layer: int, piece: int) -> None:
        """After the last piece's forward attention: its chunk leaves the cache (autograd saved it for the
        piece's backward, where the piece's offload unit moves it like its other activations); a ``None`` marker
        stays so `put` and `take` still see that the piece ran its forward and not yet its backward."""
        if not self.is_last(piece):
            raise ExecError(f"sppo: piece {piece} of layer {layer} is not the stage's last; later pieces read its K/V")
        self.k[layer][piece] = None
        self.v[layer][piece] = None

    def put(self, layer: int, piece: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if piece in self.k[layer]:
            raise ExecError(f"sppo: layer {layer} piece {piece} ran its forward twice in one step")
        have = sorted(self.k[layer])
        if have != list(range(piece)):
            raise ExecError(f"sppo: piece {piece} of layer {layer} runs forward with the K/V of pieces {have} "
                            f"cached; it needs pieces 0..{piece - 1} (forward in subsequence order)")
        self.k[layer][piece] = k
        self.v[layer][piece] = v
        self.peak_bytes = max(self.peak_bytes, self.nbytes())

    def _bhsd(self, t: torch.Tensor) -> torch.Tensor:
        b, s, _ = t.shape
        return t.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)

    def prefix(self, layer: int, piece: int, own: tuple[torch.Tensor, torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of tokens [0, end of ``piece``) as ``[b, Hk, S, d]`` (a concatenation); ``own``: the piece's
        own K/V chunk where the cache handed it over (the last piece's backward), else the cache's."""
        own_k, own_v = own if own is not None else (self.k[layer][piece], self.v[layer][piece])
        ks = [self.k[layer][j] for j in range(piece)] + [own_k]
        vs = [self.v[layer][j] for j in range(piece)] + [own_v]
        k = ks[0] if len(ks) == 1 else torch.cat(ks, dim=1)
        v = vs[0] if len(vs) == 1 else torch.cat(vs, dim=1)
        return self._bhsd(k), self._bhsd(v)

    def accumulate(self, layer: int, dk: torch.Tensor, dv: torch.Tensor, below: int) -> None:
        """Add the rows of pieces 0..below-1 of ``dk``/``dv`` (``[b, Hk, S, d]``) to their accumulators."""
        for j in range(below):
            a, e = self.starts[j], self.ends[j]
            for acc, g in ((self.dk, dk), (self.dv, dv)):
                rows = g[:, :, a:e].transpose(1, 2).reshape(g.shape[0], e - a, -1)
                if j in acc[layer]:
                    acc[layer][j].add_(rows)
                else:
                    acc[layer][j] = rows.to(self.k[layer][j].dtype).clone()
        self.peak_bytes = max(self.peak_bytes, self.nbytes())

    def take(self, layer: int, piece: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The accumulated dK/dV of ``piece`` (None where no later piece added any), and drop the
        piece's chunk: its backward is the last use."""
        later = [j for j in self.k[layer] if j > piece]
        if later:
            raise ExecError(f"sppo: piece {piece} of layer {layer} runs backward before pieces {later} "
                            "(backward must run in reverse subsequence order: their dK/dV would be missing)")
        dk, dv = self.dk[layer].pop(piece, None), self.dv[layer].pop(piece, None)
        del self.k[layer][piece], self.v[layer][piece]
        return dk, dv


class PrefixAttention(torch.autograd.Function):
    """Attention of one piece through the stage's K/V cache (module docs). q ``[b, n, H*d]``,
    k/v ``[b, n, Hk*d]`` token-major; returns ``[b, n, H*d]``."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, layer: int,
                piece: int) -> torch.Tensor:
        b, n, _ = q.shape
        H, d = cache.heads, cache.head_dim
        kc, vc = k.detach().contiguous(), v.detach().contiguous()
        cache.put(layer, piece, kc, vc)
        kk, vv = cache.prefix(layer, piece)
        qh = q.view(b, n, H, d).transpose(1, 2)
        out, lse = prefix_attention_forward(qh, kk, vv, cache.starts[piece])
        del kk, vv
        out = out.transpose(1, 2).reshape(b, n, H * d)
        ctx.cache, ctx.layer, ctx.piece = cache, layer, piece
        ctx.lse = lse  # the lse stays on the device (not an activation the offload moves)
        ctx.own_kv = cache.is_last(piece)
        if ctx.own_kv:  # no later piece reads it: an activation of this piece, offloaded with the rest (module docs)
            cache.hand_over(layer, piece)
            ctx.save_for_backward(q, out, kc, vc)
        else:
            ctx.save_for_backward(q, out)
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        q, out, *own = ctx.saved_tensors  # own: the last piece's K/V chunk (forward)
        cache, layer, piece = ctx.cache, ctx.layer, ctx.piece
        b, n, _ = q.shape
        H, d = cache.heads, cache.head_dim
        kk, vv = cache.prefix(layer, piece, tuple(own) if ctx.own_kv else None)
        del own
        bh = lambda t: t.reshape(b, n, H, d).transpose(1, 2)  # noqa: E731
        dq, dk, dv = prefix_attention_backward(bh(dout), bh(q), kk, vv, bh(out), ctx.lse, cache.starts[piece])
        del kk, vv
        cache.accumulate(layer, dk, dv, piece)
        a = cache.starts[piece]
        acc_k, acc_v = cache.take(layer, piece)
        own_k = dk[:, :, a:].transpose(1, 2).reshape(b, n, -1)
        own_v = dv[:, :, a:].transpose(1, 2).reshape(b, n, -1)
        if acc_k is not None:
            own_k = own_k + acc_k
            own_v = own_v + acc_v
        ctx.lse = None
        return (dq.transpose(1, 2).reshape(b, n, H * d), own_k.to(q.dtype), own_v.to(q.dtype), None, None, None)
