"""MEMO token-wise offload (paper sec. 4.1) and full offload (alpha = 1).

Rounding buffers: two preallocated device blocks, each holding one layer's skeletal tensors
(x, ln1, q, k, v, attn, h1, ln2, fc1, act); layer i uses block i % 2. Layer i-1's last op writes
layer i's input straight into block i % 2.

Forward of an offloaded layer i (every layer but the last two):
  compute records ``fwd_done[i]``; the offload stream waits on it and copies to the host pool
  x and attn whole and, of every role-"other" tensor, the first ``n_off = round(alpha*T)``
  tokens (a contiguous prefix of a token-major tensor); it then records ``offloaded[i]``.
  Before anything writes block i % 2 again (layer i+1's final add writes layer i+2's input
  there) the compute stream waits on ``offloaded[i]``.
Backward: after layer i's backward, compute records ``bwd_done[i]``; the prefetch stream waits
  on it and copies layer i-2's host data back into block i % 2, then records ``prefetched[i-2]``
  while layer i-1's backward runs. Before layer j's backward the compute stream waits on
  ``prefetched[j]`` and recomputes rows [n_off, T) token-wise from x and attn.
The last two layers are neither offloaded nor recomputed: they go straight into backward.
The attention lse and the LayerNorm statistics stay on the device for every layer.
"""

from __future__ import annotations

import math

import torch

from memo_exec.activations.base import ActivationPolicy
from memo_exec.activations.host_pool import HostPool
from memo_exec.layer import SKELETAL, LayerStorage, LayerWeights, carve_storage, skeletal_roles, skeletal_widths, \
    storage_bytes
from memo_exec.streams import CopyLabel
from memo_sim.policy.policies import NO_OFFLOAD_LAST_LAYERS


def offload_token_count(fraction: float, tokens: int) -> int:
    """Tokens of each role-"other" tensor that go to the host: round(alpha * T), halves up."""
    return max(0, min(tokens, int(math.floor(fraction * tokens + 0.5))))


class TokenOffload(ActivationPolicy):
    def __init__(self, *args, fraction: float, label: str) -> None:
        super().__init__(*args)
        self.fraction = fraction
        self.name = label
        self.n_off = offload_token_count(fraction, self.tokens)
        roles = skeletal_roles(self.model)
        self.whole = [n for n in SKELETAL if roles[n] in ("input", "attn")]
        self.split = [n for n in SKELETAL if roles[n] == "other"]
        self.widths = skeletal_widths(self.model)

    def offloaded(self, i: int) -> bool:
        return i < self.layers - NO_OFFLOAD_LAST_LAYERS

    @property
    def n_offloaded(self) -> int:
        return max(0, self.layers - NO_OFFLOAD_LAST_LAYERS)

    def _host_shapes(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        shapes = [((self.tokens, self.widths[n]), self.dtype) for n in self.whole]
        if self.n_off:
            shapes += [((self.n_off, self.widths[n]), self.dtype) for n in self.split]
        return shapes

    def layer_offload_bytes(self) -> int:
        esize = torch.empty((), dtype=self.dtype, device="meta").element_size()
        return sum(math.prod(s) for s, _ in self._host_shapes()) * esize

    def device_bytes(self) -> dict[str, int]:
        return {"rounding_buffers": 2 * storage_bytes(self.model, self.tokens, self.dtype),
                "norm_stats": self.layers * self._stats_bytes(), "lse": self.layers * self.lse_bytes_per_layer()}

    def host_bytes(self) -> int:
        return self.n_offloaded * HostPool.layout_bytes(self._host_shapes())

    def allocate(self) -> None:
        nb = storage_bytes(self.model, self.tokens, self.dtype)
        self.blocks = [torch.empty(nb, dtype=torch.uint8, device=self.device) for _ in range(2)]
        bufs = [carve_storage(b, self.model, self.tokens, self.dtype) for b in self.blocks]
        self.storages = [LayerStorage(bufs[i % 2], self._stats()) for i in range(self.layers)]
        self.pool = HostPool(self.host_bytes(), self.device)
        self.host: list[dict[str, torch.Tensor]] = []
        for _ in range(self.n_offloaded):
            h = {n: self.pool.take((self.tokens, self.widths[n]), self.dtype) for n in self.whole}
            if self.n_off:
                h.update({n: self.pool.take((self.n_off, self.widths[n]), self.dtype) for n in self.split})
            self.host.append(h)
        ev = self.engine.event
        self.ev_fwd = [ev() for _ in range(self.layers)]
        self.ev_off = [ev() for _ in range(self.layers)]
        self.ev_bwd = [ev() for _ in range(self.layers)]
        self.ev_pf = [ev() for _ in range(self.layers)]

    @property
    def pinned_bytes(self) -> int:
        return self.pool.nbytes if hasattr(self, "pool") else 0

    def close(self) -> None:
        if hasattr(self, "pool"):
            self.engine.synchronize()
            self.pool.close()

    # -- copies ----------------------------------------------------------------------------------
    def _pairs(self, i: int, to_host: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
        dev, host = self.storages[i].tensors, self.host[i]
        pairs = [(host[n], dev[n]) for n in self.whole]
        if self.n_off:
            pairs += [(host[n], dev[n][:self.n_off]) for n in self.split]
        return pairs if to_host else [(d, h) for h, d in pairs]

    def _wait(self, ev, what: str, i: int) -> None:
        with self.timer.span(f"wait_{what}", i, "stall"):
            self.engine.compute.wait_event(ev)

    # -- per layer -------------------------------------------------------------------------------
    def storage_for_forward(self, i: int) -> LayerStorage:
        if i >= 2 and self.offloaded(i - 2):
            self._wait(self.ev_off[i - 2], "offload", i - 2)
        return self.storages[i]

    def output_for(self, i: int) -> torch.Tensor | None:
        if i + 1 >= self.layers:
            return None
        if i >= 1 and self.offloaded(i - 1):  # block (i+1)%2 still holds layer i-1 until its offload ends
            self._wait(self.ev_off[i - 1], "offload", i - 1)
        return self.storages[i + 1].x

    def after_forward(self, i: int) -> None:
        if not self.offloaded(i):
            return
        eng = self.engine
        eng.compute.record(self.ev_fwd[i])
        eng.d2h.wait_event(self.ev_fwd[i])
        eng.d2h.copy_group(self._pairs(i, True), CopyLabel("offload", i, "offload", self.layer_offload_bytes()))
        eng.d2h.record(self.ev_off[i])

    def storage_for_backward(self, i: int, weights: LayerWeights) -> LayerStorage:
        s = self.storages[i]
        if self.offloaded(i):
            self._wait(self.ev_pf[i], "prefetch", i)
            if self.n_off < self.tokens:
                self.compute.recompute_tokens(weights, s, self.n_off, i)
        return s

    def after_backward(self, i: int) -> None:
        j = i - 2
        if j < 0 or not self.offloaded(j):
            return
        eng = self.engine
        eng.compute.record(self.ev_bwd[i])
        eng.h2d.wait_event(self.ev_bwd[i])
        eng.h2d.copy_group(self._pairs(j, False), CopyLabel("prefetch", j, "prefetch", self.layer_offload_bytes()))
        eng.h2d.record(self.ev_pf[j])

    def end_step(self) -> None:
        self.engine.raise_if_failed()

    def describe(self) -> dict:
        return {"policy": self.name, "fraction": self.fraction, "offload_tokens": self.n_off, "tokens": self.tokens,
                "offloaded_layers": self.n_offloaded, "layer_offload_bytes": self.layer_offload_bytes(),
                "whole": self.whole, "split": self.split}
