"""The activation-policy interface: what a policy keeps, offloads and recomputes, once.

A policy decides what happens to a layer's skeletal activations between its forward and its
backward. Each policy is one module (`store_all`, `full_recompute`, `full_offload`, `memo`)
registered by name in `memo_sim.policy.registry`; the cost model, the memory accounting, the
request traces, the event schedule and the executor ask the policy object and never branch on
its name.

Byte arguments ``sk`` are one layer's per-GPU skeletal bytes by MEMO role, as
`memo_sim.cost.activations.skeletal_bytes` returns them: ``input`` (the layer input x),
``attn`` (attention output), ``other`` (the rest, split token-wise by MEMO), ``lse`` (the
attention log-sum-exp: kept on the GPU from a layer's forward to its backward by every policy whose
backward reads the forward's, `Policy.keeps_lse`; rebuilt by the recompute of a policy that re-runs the
whole layer) and ``total`` (input + attn + other).
"""

from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import ClassVar, Protocol

from memo_sim.cost.activations import kept_scale, layer_rows, row_bytes, saved_tensors
from memo_sim.cost.layer_time import OpCost
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.policy.host_layout import OffloadedTensor, copy_bytes, host_block_bytes, offload_token_count
from memo_sim.policy.rounding_buffers import offloaded_layer_count
from memo_sim.profile.schema import HardwareProfile


class ModelSteps(Protocol):
    """Step indices of the whole-model (level-2) request trace, given by the trace builder."""

    def fwd(self, layer: int) -> int: ...

    def bwd(self, layer: int) -> int: ...

    @property
    def end_of_backward(self) -> int: ...


@dataclass(frozen=True)
class Policy:
    """One activation policy; ``alpha`` only for policies that take it (MEMO)."""

    alpha: float | None = None

    name: ClassVar[str] = "base"
    takes_alpha: ClassVar[bool] = False
    offloads: ClassVar[bool] = False  # skeletal bytes go to host after the forward
    recomputes_attention: ClassVar[bool] = False  # the whole layer forward re-runs before backward
    # the recompute re-runs the layer's norms and activations, not the whole layer (torchtitan's per-op
    # checkpointing): what eager kernels save inside them is made again (`rebuilt_extras`)
    rebuilds_memory_bound_ops: ClassVar[bool] = False
    static_memory_plan: ClassVar[bool] = False  # transients placed by MEMO's bi-level plan
    needs_experts: ClassVar[bool] = False  # only for mixture-of-experts models (it rebuilds or moves MoE tensors)
    # the skeletal roles an offloading policy copies to host whole (the "other" ones by ``offload_fraction_other``)
    offloaded_roles: ClassVar[tuple[str, ...]] = ("input", "attn")
    # whether each layer's attention lse stays on the GPU from its forward to its backward (every layer's at once);
    # False where the recompute re-runs the attention and rebuilds it: one layer's lse then lives from its recompute
    # to the end of its backward, beside the recompute buffer (`recompute_allocated`), as memo-exec holds it
    # (memo_exec/activations/full_recompute.py ``after_forward``: ``aux = None``, ``device_bytes`` one layer's lse;
    # Megatron-LM's full recompute, tensor_parallel.checkpoint, saves the layer input alone). The one switch the
    # analytic footprint (`memo_sim.memplan.footprint`), the level-2 traces (`memo_sim.memplan.trace_gen`,
    # `memo_sim.memplan.stage_plan`) and the event schedules (through `forward_kept`) read.
    keeps_lse: ClassVar[bool] = True
    summary: ClassVar[str] = ""

    @property
    def recomputes_mtp(self) -> bool:
        """Whether the multi-token-prediction modules are checkpointed whole, their forward run again before their
        backward (`memo_sim.cost.boundary.mtp_seconds`): under a policy that re-runs whole layers, as Megatron-LM
        checkpoints the module under full recompute."""
        return self.recomputes_attention

    @staticmethod
    def model_why_not(model: ModelConfig) -> str | None:
        """Why the policy cannot price ``model`` (None: it can; the what-if leaves it out, or refuses it when
        asked for by name)."""
        return None

    @classmethod
    def experts_why_not(cls, model: ModelConfig) -> str | None:
        """Why a policy that rebuilds or moves a mixture of experts' tensors (``needs_experts``) cannot price ``model``,
        or None: the one wording the what-if, the commands' --policy and a plan's check use."""
        if cls.needs_experts and not model.moe:
            return f"{cls.name} acts on a mixture of experts' tensors: model {model.name} has no experts"
        return None

    # whether the policy runs beside `Layout.ep_overlap` (Megatron-Core's merged forward and backward steps,
    # `memo_sim.engine.schedules.ep_overlap`), and the reason where it does not
    ep_overlap_ok: ClassVar[bool] = False
    ep_overlap_refusal: ClassVar[str] = ("memo lays out no host copies or whole-layer re-runs inside a merged "
                                         "forward-backward step")

    @classmethod
    def layout_why_not(cls, layout) -> str | None:
        """Why the policy cannot run on ``layout`` (None: it can; the search leaves the pair out, the simulator
        refuses it when asked for): beside ``ep_overlap`` its own rule above, then the policy's (`own_layout_why_not`)."""
        if getattr(layout, "ep_overlap", False) and not cls.ep_overlap_ok:
            return (f"{cls.name} does not run beside the EP all-to-all overlap (--ep-overlap): {cls.ep_overlap_refusal}; "
                    f"use store_all, selective_recompute or recompute_norm_act, or turn the overlap off")
        return cls.own_layout_why_not(layout)

    @staticmethod
    def own_layout_why_not(layout) -> str | None:
        """The policy's own reason it cannot run on ``layout`` (None: it can)."""
        return None

    def __post_init__(self) -> None:
        if self.takes_alpha:
            a = self.alpha
            if isinstance(a, bool) or not isinstance(a, (int, float)) or not (0.0 <= a <= 1.0):
                raise MemoError(f"alpha (--alpha, or policy.alpha in a plan file) must lie in [0, 1] for the "
                                f"{self.name} policy, got {a!r}: give a number such as 0.5, or leave --alpha out "
                                f"and let the what-if solve it")
        elif self.alpha is not None:
            raise MemoError(f"alpha applies only to the memo policy, not {self.name}")

    # -- what moves where ---------------------------------------------------------------------------
    @property
    def offload_fraction_other(self) -> float:
        """Share of the role-"other" skeletal bytes copied to host (input and attn go whole)."""
        return 0.0

    @property
    def recompute_fraction(self) -> float:
        """Share of the tokens whose non-input skeletal tensors are rebuilt before backward."""
        return 0.0

    def offloaded_layers(self, n_layers: int) -> int:
        """Layers 0 .. k-1 go to host (the last ones go straight into backward)."""
        return offloaded_layer_count(n_layers) if self.offloads else 0

    def recomputes_layer(self, layer: int, n_layers: int) -> bool:
        return False

    def recomputed_count(self, n_layers: int) -> int:
        """How many of ``n_layers`` layers (or a stage's units) `recomputes_layer` says recompute,
        memoised per policy and count (the bounds ask for it once per candidate)."""
        return _recomputed_count(self, n_layers)

    def rebuilt(self) -> tuple:
        """Which of a recomputing layer's tensors the policy drops and which ops it re-runs, where
        that is a fixed set rather than a token share or the whole forward (selective recompute's
        attention core, Megatron's --recompute-modules groups, per-op checkpointing's save list);
        () where `recompute_fraction` and `recomputes_attention` say it all."""
        return ()

    def behaviour(self, n_layers: int) -> tuple:
        """What the policy does with a layer's skeletal tensors, whatever it is called: offloads
        or not, the offloaded share of the "other" tensors, the recomputed share and which layers
        recompute, whether the whole forward re-runs, what a recomputing layer drops and re-runs
        (`rebuilt`). Equal tuples move and rebuild the same bytes (``memo`` at alpha = 1 and
        ``full_offload``); the what-if folds such rows."""
        return (self.offloads, self.offload_fraction_other if self.offloads else 0.0, self.recompute_fraction,
                self.recomputes_attention,
                tuple(i for i in range(n_layers) if self.recomputes_layer(i, n_layers)), self.rebuilt())

    def offloaded_tensors(self, model: ModelConfig, layout: Layout, batch: int,
                          seq: int) -> list[OffloadedTensor]:
        """Per offloaded layer and GPU: each skeletal tensor's rows copied to host. The roles of
        ``offloaded_roles`` (MEMO: the layer input and the attention output) go whole; the other
        skeletal tensors their first ``offload_token_count(offload_fraction_other, rows)`` rows;
        lse stays on the GPU."""
        if not self.offloads:
            return []
        rows = layer_rows(layout, batch, seq)
        split = offload_token_count(self.offload_fraction_other, rows)
        return [OffloadedTensor(t.name, rows if t.role in self.offloaded_roles else split,
                                row_bytes(t, layout) * kept_scale(t.name, model, layout))
                for t in saved_tensors(model, layout) if t.role in ("input", "attn", "other")]

    def offload_bytes(self, model: ModelConfig, layout: Layout, batch: int, seq: int) -> float:
        """Bytes one offloaded layer copies to host (and back) on one GPU."""
        return copy_bytes(self.offloaded_tensors(model, layout, batch, seq))

    def host_bytes_per_layer(self, model: ModelConfig, layout: Layout, batch: int, seq: int,
                             profile: HardwareProfile) -> float:
        """Pinned host bytes one offloaded layer takes on one GPU, as the layout's ``host_pool`` allocates them."""
        return host_block_bytes(self.offloaded_tensors(model, layout, batch, seq), layout.host_pool,
                                profile.host.pinned_rounding)

    def recompute_costs(self, model: ModelConfig, layout: Layout, batch: int, seq: int,
                        profile: HardwareProfile) -> list[OpCost]:
        """The ops re-run before a recomputing layer's backward."""
        return []

    # -- GPU memory -----------------------------------------------------------------------------------
    def resident_bytes(self, sk: dict[str, float], n_layers: int) -> float:
        """Skeletal bytes kept on the GPU across layers (all layers together)."""
        return 0.0

    def buffer_bytes(self, sk: dict[str, float]) -> float:
        """Static working buffers for skeletal tensors (rounding buffers, recompute buffer)."""
        return 0.0

    def kept_lse(self, sk: dict[str, float]) -> list[tuple[str, float]]:
        """The attention lse a layer keeps from its forward to its backward, as a (tensor, bytes) list: one layer's
        lse where `keeps_lse`, else none."""
        return [("lse", sk["lse"])] if self.keeps_lse else []

    def _extras(self, sk: dict[str, float]) -> tuple[tuple[str, float, bool], ...]:
        """(tensor, bytes, whether the recompute makes it again) of what a layer's forward saves for its backward
        beside the skeletal tensors: the quantised weight copy (``sk["fp8_weights"]``, where the framework's FP8
        library saves it: `memo_sim.cost.gemm_format.saved_weight_bytes`), made again where the recompute re-runs the
        whole layer (``recomputes_attention``), and what eager PyTorch's composite norms and activations keep
        (``sk["eager_saved"]``: `memo_sim.model.eager_kernels`), made again where the recompute re-runs them too
        (``rebuilds_memory_bound_ops``: torchtitan's per-op checkpointing)."""
        return (("fp8_weights", sk.get("fp8_weights", 0.0), self.recomputes_attention),
                ("eager_saved", sk.get("eager_saved", 0.0),
                 self.recomputes_attention or self.rebuilds_memory_bound_ops))

    def kept_extras(self, sk: dict[str, float]) -> list[tuple[str, float]]:
        """`_extras` kept from the forward to the backward by every layer, like the forward's other saved tensors, as
        a (tensor, bytes) list: those the recompute does not make again (`rebuilt_extras`: a checkpointed layer's
        forward saves nothing inside it). Not offloaded by any policy."""
        return [(n, b) for n, b, rebuilt in self._extras(sk) if b > 0 and not rebuilt]

    def rebuilt_extras(self, sk: dict[str, float]) -> list[tuple[str, float]]:
        """`_extras` the recompute makes again: one layer's, from its recompute to its backward's end."""
        return [(n, b) for n, b, rebuilt in self._extras(sk) if b > 0 and rebuilt]

    def layer_kept_blocks(self, sk: dict[str, float]) -> list[tuple[str, float]]:
        """What a layer holds from its forward to its backward in a whole-model request trace (level 2 of the memory
        plan): its lse where kept, its `layer_blocks`, its saved weight copy and eager tensors (`kept_extras`)."""
        return self.kept_lse(sk) + self.layer_blocks(sk) + self.kept_extras(sk)

    def forward_kept(self, sk: dict[str, float]) -> list[tuple[str, float]]:
        """(tensor, bytes) a layer allocates at its forward and frees after its backward."""
        return self.kept_lse(sk) + self.kept_extras(sk)

    def recompute_allocated(self, sk: dict[str, float]) -> list[tuple[str, float]]:
        """(tensor, bytes) allocated when the recompute starts, freed after the backward."""
        return []

    def backward_buffer_bytes(self, sk: dict[str, float]) -> float:
        """The part of `buffer_bytes` allocated at a layer's recompute and freed after its backward
        (`recompute_allocated`): not live beside the classifier, which runs before any backward."""
        return sum(b for _n, b in self.recompute_allocated(sk))

    def static_gpu(self, sk: dict[str, float]) -> list[tuple[str, float]]:
        """(tensor, bytes) allocated before the iteration and held throughout."""
        return []

    # -- whole-model request trace (level 2 of the memory plan) ----------------------------------------
    def layer_blocks(self, sk: dict[str, float]) -> list[tuple[str, float]]:
        """Per-layer skeletal blocks, live from the layer's forward to its backward (besides lse)."""
        return []

    def shared_blocks(self, sk: dict[str, float], steps: ModelSteps,
                      n_layers: int) -> list[tuple[str, float, int, int]]:
        """Skeletal blocks shared by all layers: (name, bytes, first step, end step)."""
        return []

    def pipeline_rank_blocks(self, sk: dict[str, float]) -> list[tuple[str, float]]:
        """Blocks a pipeline rank holds once for all its micro-batches in flight, through the step, in place of
        `shared_blocks` per (chunk, micro-batch): (name, bytes); none by default."""
        return []

    # -- naming --------------------------------------------------------------------------------------
    def label(self) -> str:
        return self.name

    def to_dict(self) -> dict:
        return {"policy": self.name, "alpha": self.alpha}


def uses_memory_plan(policy: "Policy", layout: Layout) -> bool:
    """Whether a static memory plan places the plan's transient tensors: MEMO's bi-level plan
    (``policy.static_memory_plan``), or a layout asked to run on one whatever its policy
    (``layout.memory_plan``: ``memo-sim whatif --allocator plan``); otherwise PyTorch's caching
    allocator places them, with its fragmentation and retries
    (`memo_sim.memplan.iteration_replay`). The one place this is decided."""
    return bool(policy.static_memory_plan or layout.memory_plan)


@functools.lru_cache(maxsize=8192)
def _recomputed_count(policy: Policy, n_layers: int) -> int:
    return sum(1 for i in range(n_layers) if policy.recomputes_layer(i, n_layers))
