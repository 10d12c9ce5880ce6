"""Megatron-LM's fine-grained activation offloading of the attention (`memo_sim.policy.offload_modules`
``offload_attn``: ``--offload-modules core_attn attn_proj``): every layer keeps its skeletal tensors in a block of
its own, as under store all, but the attention kernel's q, k, v and its output, which lie in two rounding buffers
the layers take in turn (layer i's in buffer ``rounding_buffer(i)``), go to host beside the next layer's forward and
come back beside the backward of the layer after, by the four edges of MEMO's rounding-buffer rule that
`TokenOffload` implements and declares to the race detector (the moved tensors: the simulator policy's
``offloaded_tensors``). Nothing is recomputed; the attention lse stays on the device with every layer, and a MoE
layer keeps its block's graph, as the simulator prices it (store all's).

Edge 2 (the last op of forward(i) waits for offload(i-1)) is kept where MEMO has it, though the first write into
buffer (i+1) % 2 here is layer i+1's q rather than its input (which lies in the layer's own block): the wait comes
one op earlier than the buffer needs, as the simulator's schedule prices it. On a pipeline rank the buffers are the
rank's four (two forward, two prefetch: `memo_exec.activations.pipeline_rounding`) and each layer's own block is its
slot's (`ActivationPolicy.layer_block`).

``offload_attn_experts`` (the experts' dispatched tokens too) is not run here: memo-exec's MoE block keeps them in
its autograd graph (`memo_exec.moe.block`), which this policy does not move.
"""

from __future__ import annotations

import torch

from memo_exec.activations.registry import register
from memo_exec.activations.token_offload import TokenOffload
from memo_exec.layer import SKELETAL, LayerStorage, carve_storage, storage_bytes, written_skeletal
from memo_sim.policy.rounding_buffers import N_BUFFERS, rounding_buffer


@register("offload_attn")
class OffloadModules(TokenOffload):
    moe_block_differs = None  # every layer keeps its MoE block's graph, as the simulator's store-all part

    def __init__(self, *args) -> None:
        super().__init__(*args)
        # the kernel's q and k are the QK norms' outputs where a framework keeps those (`ModelConfig.qk_norm_kept`);
        # this executor keeps the projections alone and normalises them again (memo_exec/report.py says so), so it
        # moves the projections in their place
        names = {n.removesuffix("_normed") for n in self.choice.offloaded_names(self.model)}
        self.whole = [n for n in SKELETAL if n in names]  # q, k, v, attn: moved whole, never by rows
        self.split = []
        self.n_off = 0

    # -- sizes -------------------------------------------------------------------------------------
    def _kept_names(self, i: int) -> tuple[str, ...]:
        """The tensors layer ``i`` keeps in its own block: those it writes (store all's), less the moved ones."""
        return tuple(n for n in self.layer_names(written_skeletal(self.model), i) if n not in self.whole)

    def _kept_bytes(self, i: int) -> int:
        return storage_bytes(self.model, self.tokens, self.dtype, self._kept_names(i), shapes=self.shapes)

    def device_bytes(self) -> dict[str, int]:
        n = self.layers
        moved = storage_bytes(self.model, self.tokens, self.dtype, tuple(self.whole), shapes=self.shapes)
        return {"skeletal_resident": sum(self._kept_bytes(i) for i in range(n)) + self.moe_kept_bytes(lambda i: True),
                "buffers": self.rounding_blocks() * moved,
                "norm_stats": n * self._stats_bytes(), "lse": n * self.lse_bytes_per_layer()}

    # -- allocation --------------------------------------------------------------------------------
    def _own_blocks(self) -> None:
        """Each layer's own block of the tensors it keeps (`_kept_names`)."""
        self.kept = [carve_storage(self.layer_block(f"layer {i}", self._kept_bytes(i)), self.model, self.tokens,
                                   self.dtype, self._kept_names(i), shapes=self.shapes) for i in range(self.layers)]

    def _device_storages(self) -> list[LayerStorage]:
        self._own_blocks()
        moved = tuple(self.whole)
        nb = storage_bytes(self.model, self.tokens, self.dtype, moved, shapes=self.shapes)
        self.blocks = [torch.empty(nb, dtype=torch.uint8, device=self.device) for _ in range(N_BUFFERS)]
        bufs = [carve_storage(b, self.model, self.tokens, self.dtype, moved, shapes=self.shapes) for b in self.blocks]
        storages = [LayerStorage({**self.kept[i], **bufs[rounding_buffer(i)]}, self._stats(f"stats {i}"))
                    for i in range(self.layers)]
        for st in storages:
            st.keep_moe_internals = True
        return storages

    @property
    def _rank_names(self):
        return tuple(self.whole)

    def _pipeline_storages(self) -> list[LayerStorage]:
        self._own_blocks()
        return [LayerStorage({**self.kept[i], **self.rounding.fwd[rounding_buffer(i)]}, self._stats(f"stats {i}"))
                for i in range(self.layers)]

    def bind(self, kind: str, chunk: int, mb: int) -> None:
        super().bind(kind, chunk, mb)
        if self.rounding is not None and kind == "fwd":
            for i, st in enumerate(self.storages):  # the rank's buffer for the moved tensors, the layer's own block
                st.tensors = {**self.kept[i], **st.tensors}  # for the rest; the MoE graph kept whatever the unit
                st.keep_moe_internals = True

    def prefetch_unit(self, i: int, k: int, u: int) -> None:
        super().prefetch_unit(i, k, u)
        self.storages[i].tensors = {**self.kept[i], **self.storages[i].tensors}

    # -- regions the race detector sees ----------------------------------------------------------------
    def _slot(self, i: int, n: str) -> str:
        if n not in self.whole:
            return f"layer {i}{self.tag} block {n}"
        return super()._slot(i, n)

    def _buf(self, i: int, names, rows=None):
        have = self.storages[i].tensors  # a MoE layer writes no fc1 or act (`_kept_names`)
        return super()._buf(i, [n for n in names if n in have], rows)

    # -- per layer: nothing is rebuilt -------------------------------------------------------------
    def recompute(self, compute, weights, storage, i: int) -> None:
        return None

    def describe(self) -> dict:
        return {**super().describe(), "kept": "every layer's other skeletal tensors, in its own block"}
