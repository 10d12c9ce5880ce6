"""One MoE layer's FFN-block weights: router, this rank's routed experts, shared experts (+ gate).

Parameter names (under a layer's ``moe.``): ``router_w`` [E, h] (+ ``router_b`` [E] with
``moe_bias``), ``expert_w1`` [E_local, fc1, h], ``expert_w2`` [E_local, h, w] (+ ``expert_b1``,
``expert_b2`` with ``moe_bias``), ``shared_w1`` [shared fc1 / tp, h], ``shared_w2`` [h, shared / tp]
and ``shared_gate`` [1, h] (Qwen2-MoE). The counts match `ModelConfig.moe_block_params` exactly.

Initialisation: the router and the shared experts are drawn from the layer's generator like the
dense weights (`memo_exec.layer.LayerWeights.init_`), the routed experts never: each expert is
drawn from its own generator seeded by (seed, global layer, global expert index)
(`init_experts_`), so a rank holding experts [a, b) of an expert-parallel group holds exactly the
experts a single process holds at those indices, without drawing the others.

Expert tensor parallelism (``etp`` p > 1, Megatron-Core's ``--expert-tensor-parallel-size``): ETP rank j holds
slice j of every local expert's FFN, the column-parallel fc1's output rows (under SwiGLU slice j of the gate
half and the same slice of the up half, so its activation pairs them as the whole expert's does) and the
row-parallel fc2's matching input columns: ``expert_w1`` [E_local, fc1 / p, h], ``expert_w2`` [E_local, h, w / p]
(`etp_slice`; drawn whole from the expert's generator, then sliced). With expert biases (GPT-OSS) fc1's bias
is sliced as its output rows, ``expert_b1`` [E_local, fc1 / p], and fc2's, whole on every ETP rank, is added by ETP
rank 0 alone (``adds_b2``), so the group's summed partial outputs hold it once, as Megatron-Core's row-parallel
layer adds its bias after the reduction; the other ranks' copy stays out of the graph (zero gradient, never
updated). `join_etp` puts the p slices of a gradient back together.
"""

from __future__ import annotations

import torch
from torch import nn

from memo_sim.model.config import ModelConfig

EXPERT_PREFIX = "expert_"
TP_ROWS = ("shared_w1",)
TP_COLS = ("shared_w2",)
REPLICATED = ("router_w", "router_b", "shared_gate")


def expert_seed(seed: int, layer: int, expert: int) -> int:
    return (seed * 1_000_003 + layer * 65_537 + expert * 257 + 12_345) % (1 << 62)


class MoEWeights(nn.Module):
    def __init__(self, model: ModelConfig, device, dtype, tp: int = 1, first: int = 0, n_local: int | None = None,
                 etp: tuple[int, int] = (1, 0)):
        super().__init__()
        h, E = model.hidden, model.experts
        self.model, (self.etp, self.etp_rank) = model, etp
        self.adds_b2 = self.etp_rank == 0  # fc2's bias, added once over the ETP group (module docs)
        self.first = first
        self.n_local = E if n_local is None else n_local
        mk = lambda *s: nn.Parameter(torch.empty(*s, device=device, dtype=dtype))  # noqa: E731
        n = self.n_local
        self.router_w = mk(E, h)
        self.router_b = mk(E) if model.moe_bias else None
        if n:
            self.expert_w1 = mk(n, model.expert_fc1_width // self.etp, h)
            self.expert_w2 = mk(n, h, model.expert_width // self.etp)
            self.expert_b1 = mk(n, model.expert_fc1_width // self.etp) if model.moe_bias else None
            self.expert_b2 = mk(n, h) if model.moe_bias else None
        else:
            self.expert_w1 = self.expert_w2 = self.expert_b1 = self.expert_b2 = None
        sw = model.shared_width
        if sw:
            sfc1 = 2 * sw if model.ffn_type == "swiglu" else sw
            self.shared_w1 = mk(sfc1 // tp, h)
            self.shared_w2 = mk(h, sw // tp)
            self.shared_gate = mk(1, h) if model.shared_gate else None
        else:
            self.shared_w1 = self.shared_w2 = self.shared_gate = None

    def whole_shape(self, name: str) -> tuple[int, int]:
        """One whole expert's ``expert_w1`` or ``expert_w2`` (before the ETP slice)."""
        m = self.model
        return (m.expert_fc1_width, m.hidden) if name == "expert_w1" else (m.hidden, m.expert_width)

    def expert_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.named_parameters() if n.startswith(EXPERT_PREFIX)]

    @torch.no_grad()
    def init_experts_(self, seed: int, layer: int, std: float, out_std: float) -> None:
        """Routed experts from their own generators (module docs): one per global expert index."""
        for j in range(self.n_local):
            g = torch.Generator(device=self.router_w.device).manual_seed(expert_seed(seed, layer, self.first + j))
            for name, s in (("expert_w1", std), ("expert_w2", out_std)):
                p = getattr(self, name)[j]
                whole = torch.randn(self.whole_shape(name), generator=g, dtype=torch.float32, device=p.device)
                p.copy_(etp_slice(name, whole.mul_(s), self.model, self.etp, self.etp_rank))
            for name in ("expert_b1", "expert_b2"):
                if getattr(self, name) is not None:
                    getattr(self, name)[j].zero_()


_FC1_DIM = {"expert_w1": -2, "expert_b1": -1}  # the dimension of fc1's output rows


def _fc1_blocks(model: ModelConfig, p: int, j: int) -> list[tuple[int, int]]:
    """(start, length) blocks of a whole expert's fc1 output rows that ETP rank ``j`` of ``p`` holds."""
    w = model.expert_width
    halves = 2 if model.ffn_type == "swiglu" else 1
    return [(k * w + j * w // p, w // p) for k in range(halves)]


def etp_slice(name: str, t: torch.Tensor, model: ModelConfig, p: int, j: int) -> torch.Tensor:
    """ETP rank ``j``'s slice of ``t``, a whole expert's ``expert_w1`` [fc1, h], ``expert_b1`` [fc1] or ``expert_w2``
    [h, w] (or a stack of them, experts first: [E, ...]), module docs."""
    if p == 1:
        return t
    if name in _FC1_DIM:
        d = _FC1_DIM[name]
        return torch.cat([t.narrow(d, a, n) for a, n in _fc1_blocks(model, p, j)], d)
    if name == "expert_w2":
        w = model.expert_width
        return t.narrow(-1, j * w // p, w // p)
    raise ValueError(f"{name}: only expert_w1, expert_b1 and expert_w2 are split by etp")


def join_etp(name: str, parts: list[torch.Tensor], model: ModelConfig) -> torch.Tensor:
    """The whole [E, ...] tensor from the ``p`` ETP ranks' slices (rank order), the inverse of `etp_slice`; fc2's
    bias from ETP rank 0, the one that adds it (module docs)."""
    p = len(parts)
    if p == 1 or name == "expert_b2":
        return parts[0]
    if name == "expert_w2":
        return torch.cat(parts, -1)
    d = _FC1_DIM[name]
    halves = len(_fc1_blocks(model, p, 0))
    n = parts[0].shape[d] // halves
    return torch.cat([q.narrow(d, k * n, n) for k in range(halves) for q in parts], d)
