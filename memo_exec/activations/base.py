"""The interface every activation policy implements, called by each layer's autograd Function."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from memo_exec.layer import LayerCompute, LayerStorage, LayerWeights, norm_stats_dtype, stats_bytes
from memo_sim.model.config import ModelConfig
from memo_sim.policy.policies import PolicyChoice


class ActivationPolicy(ABC):
    """Hands each layer the storage for its forward and backward and moves data in between.

    Call order in one step: ``begin_step``; per layer i ascending ``storage_for_forward(i)``,
    ``output_for(i)``, layer forward, ``after_forward(i)``; per layer descending
    ``storage_for_backward(i)``, layer backward, ``after_backward(i)``; ``end_step``.
    """

    name = "base"

    def __init__(self, model: ModelConfig, batch: int, seq: int, layers: int, dtype: torch.dtype,
                 device: torch.device, engine, timer, compute: LayerCompute | None) -> None:
        self.model, self.batch, self.seq, self.layers = model, batch, seq, layers
        self.tokens = batch * seq
        self.dtype, self.device = dtype, device
        self.engine, self.timer, self.compute = engine, timer, compute
        self.storages: list[LayerStorage] = []

    # -- sizes, known before anything is allocated -----------------------------------------------
    @abstractmethod
    def device_bytes(self) -> dict[str, int]:
        """Bytes this policy preallocates on the device, by purpose."""

    def host_bytes(self) -> int:
        return 0

    def lse_bytes_per_layer(self) -> int:
        return self.model.heads * self.tokens * 4

    def _stats(self) -> torch.Tensor:
        return torch.empty(4, self.tokens, dtype=norm_stats_dtype(self.dtype, self.device), device=self.device)

    def _stats_bytes(self) -> int:
        return stats_bytes(self.tokens, self.dtype)

    # -- lifecycle ---------------------------------------------------------------------------------
    @abstractmethod
    def allocate(self) -> None:
        """Allocate every buffer this policy needs (before the first step)."""

    def begin_step(self) -> None:
        return None

    def end_step(self) -> None:
        return None

    def close(self) -> None:
        return None

    # -- per layer ---------------------------------------------------------------------------------
    def storage_for_forward(self, i: int) -> LayerStorage:
        return self.storages[i]

    @abstractmethod
    def output_for(self, i: int) -> torch.Tensor | None:
        """Where layer i writes its output (the next layer's x), or None for a fresh tensor."""

    def after_forward(self, i: int) -> None:
        return None

    def storage_for_backward(self, i: int, weights: LayerWeights) -> LayerStorage:
        return self.storages[i]

    def after_backward(self, i: int) -> None:
        return None

    def offloaded(self, i: int) -> bool:
        return False

    def describe(self) -> dict:
        return {"policy": self.name}


def make_policy(choice: PolicyChoice, model: ModelConfig, batch: int, seq: int, layers: int, dtype: torch.dtype,
                device: torch.device, engine, timer, compute: LayerCompute | None) -> ActivationPolicy:
    from memo_exec.activations.offload import TokenOffload  # noqa: PLC0415
    from memo_exec.activations.simple import FullRecompute, StoreAll  # noqa: PLC0415

    args = (model, batch, seq, layers, dtype, device, engine, timer, compute)
    if choice.policy == "store_all":
        return StoreAll(*args)
    if choice.policy == "full_recompute":
        return FullRecompute(*args)
    if choice.policy == "full_offload":
        return TokenOffload(*args, fraction=1.0, label="full_offload")
    return TokenOffload(*args, fraction=float(choice.alpha), label="memo")
