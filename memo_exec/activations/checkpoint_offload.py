"""Checkpoint offload (`memo_sim.policy.checkpoint_offload`): full recompute with each layer's
input on the host (DeepSpeed's ``cpu_checkpointing``).

The device holds two input buffers the layers take in turn (layer i's input x lies in buffer
``rounding_buffer(i)``: layer i-1's last op writes it there) and one work buffer every layer's other
skeletal tensors share, as `full_recompute`'s. Layer i's x goes to host beside its forward and comes
back beside layer i+1's backward, by the four edges of MEMO's rounding-buffer rule that
`TokenOffload` implements and declares to the race detector (only x moves: the simulator policy's
``offloaded_roles``); before each backward the whole layer forward re-runs from x into the work
buffer (attention included, so the lse is rebuilt, not kept). The last ``KEPT_LAYERS`` layers keep
their x in their buffer and are recomputed all the same (their work tensors were overwritten by the
layers after them, as under full recompute). On a pipeline rank the input buffers are the rank's four
(two forward, two prefetch: `memo_exec.activations.pipeline_rounding`) and the work buffer the rank's one.
"""

from __future__ import annotations

import torch

from memo_exec.activations.base import RECOMPUTE_BUFFER_DIFFERS
from memo_exec.activations.registry import register
from memo_exec.activations.token_offload import TokenOffload
from memo_exec.layer import LayerStorage, carve_storage, storage_bytes
from memo_sim.policy.rounding_buffers import N_BUFFERS, rounding_buffer


@register("checkpoint_offload")
class CheckpointOffload(TokenOffload):
    moe_block_differs = None  # the whole layer is re-run, its MoE block with it, as the simulator prices it
    allocator_differs = RECOMPUTE_BUFFER_DIFFERS  # its work buffer, as full recompute's

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.split = []  # nothing goes to host by rows: everything but x is rebuilt
        self._work_names = tuple(n for n in self.names if n not in self.whole)  # what the layers write (base)

    def device_bytes(self) -> dict[str, int]:
        x = storage_bytes(self.model, self.tokens, self.dtype, tuple(self.whole), shapes=self.shapes)
        work = storage_bytes(self.model, self.tokens, self.dtype, self._work_names, shapes=self.shapes)
        return {"skeletal_resident": self.moe_kept_bytes(),  # a MoE layer's routing (its block re-run with the layer)
                "buffers": self.rounding_blocks() * x + work,  # the input buffers and the work buffer
                "norm_stats": self._stats_bytes(), "lse": self.lse_bytes_per_layer()}

    def _device_storages(self) -> list[LayerStorage]:
        xb = storage_bytes(self.model, self.tokens, self.dtype, tuple(self.whole), shapes=self.shapes)
        self.blocks = [torch.empty(xb, dtype=torch.uint8, device=self.device) for _ in range(N_BUFFERS)]
        xs = [carve_storage(b, self.model, self.tokens, self.dtype, tuple(self.whole), shapes=self.shapes)
              for b in self.blocks]
        self.work_block = torch.empty(storage_bytes(self.model, self.tokens, self.dtype, self._work_names,
                                                    shapes=self.shapes), dtype=torch.uint8, device=self.device)
        work = carve_storage(self.work_block, self.model, self.tokens, self.dtype, self._work_names, shapes=self.shapes)
        self.recompute_work = work
        stats = self._stats()  # rebuilt with everything else: one set for every layer
        return [LayerStorage({**work, **xs[rounding_buffer(i)]}, stats) for i in range(self.layers)]

    @property
    def _rank_names(self):
        return tuple(self.whole)

    def _rank_tensors(self, block: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**self.recompute_work, **block}

    def _pipeline_storages(self) -> list[LayerStorage]:
        nb = storage_bytes(self.model, self.tokens, self.dtype, self._work_names, shapes=self.shapes)
        self.recompute_work = carve_storage(self.buffer_block("recompute", nb), self.model, self.tokens, self.dtype,
                                            self._work_names, shapes=self.shapes)
        stats = self._stats("stats")  # rebuilt with everything else: one set for every layer
        return [LayerStorage(self._rank_tensors(self.rounding.fwd[rounding_buffer(i)]), stats)
                for i in range(self.layers)]

    def bind(self, kind: str, chunk: int, mb: int) -> None:
        super().bind(kind, chunk, mb)
        for st in self.storages:  # every layer re-runs its MoE block from the rebuilt ln2 (the shared work buffer,
            st.keep_moe_internals = False  # which later layers overwrite), the rank's last two as well

    def _slot(self, i: int, n: str) -> str:
        if n not in self.whole:
            return f"work buffer {n}"
        return f"{self.where[i]} {n}" if self.rounding is not None else f"input buffer {rounding_buffer(i)} {n}"

    def after_forward(self, i: int) -> None:
        self.storages[i].aux = None  # the attention lse is rebuilt with everything else
        super().after_forward(i)

    def recompute(self, compute, weights, storage, i: int) -> None:
        if self.engine is not None:
            self._declare(f"recompute({i})", reads=self._buf(i, self.whole), writes=self._buf(i, self._work_names))
        compute.recompute_full(weights, storage, i)

    def after_backward(self, i: int) -> None:
        self.storages[i].aux = None
        super().after_backward(i)

    def describe(self) -> dict:
        return {**super().describe(), "recomputed": "every layer, attention included"}
