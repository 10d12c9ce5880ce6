"""The interface every activation policy implements, called by each layer's autograd Function."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from memo_exec.layer import LayerCompute, LayerStorage, LayerWeights, norm_stats_dtype, skeletal_widths, \
    stats_bytes, storage_shapes
from memo_exec.moe.memory import graph_bytes, layer_kept_bytes
from memo_sim.model.config import ModelConfig


class SharedBlocks:
    """A pipeline rank's device blocks that every activation slot's policy shares, one per name: the buffers no
    layer needs outside its own forward or its rebuild and backward (a recompute buffer), which one micro-batch's
    action at a time uses, as the simulator counts one recompute buffer per stage (`memo_sim.search.pipeline`)."""

    def __init__(self) -> None:
        self.blocks: dict[str, torch.Tensor] = {}
        self.states: dict[str, object] = {}

    def state(self, name: str, make):
        """An object the rank's instances share (made once by ``make()``), e.g. MEMO's rank-level rounding
        buffers (`memo_exec.activations.pipeline_rounding`)."""
        if name not in self.states:
            self.states[name] = make()
        return self.states[name]

    def block(self, name: str, nbytes: int, device: torch.device) -> torch.Tensor:
        b = self.blocks.get(name)
        if b is None:
            b = self.blocks[name] = torch.empty(nbytes, dtype=torch.uint8, device=device)
        elif b.numel() != nbytes:  # every slot's layers have the same per-layer shapes
            raise ValueError(f"shared block {name!r}: {nbytes} bytes asked, {b.numel()} held")
        return b

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self.blocks.values())


class SlotBlocks:
    """One activation slot's blocks on a pipeline rank, by name, shared by the slot's instances of different sizes.

    A slot serves one (chunk, micro-batch) at a time (`memo_exec.pipeline.order.slots`: a forward takes it, its
    backward frees it), so where an uneven split gives a rank chunks of different layer counts, the slot's instance
    over a 2-layer chunk and its instance over a 1-layer chunk are never live together: the second takes its layer
    blocks, norm statistics and host slots from the first's (a prefix of each), as the simulator counts a stage's
    activations by the chunks in flight. Made the instance per slot and size, each its own, a rank of Megatron's
    ``--account-for-embedding-in-pipeline-split`` (chunks of 2 and 1 layers) held 3 layers' storage a slot for 2
    (a toy pp2 v3 MEMO plan: pinned pool +121% of the simulator's)."""

    def __init__(self) -> None:
        self.blocks: dict[str, object] = {}

    def take(self, name: str, nbytes: int, make):
        """The slot's block ``name`` cut to ``nbytes`` (``make(nbytes)`` the first time). A later instance asking
        more than the block holds (a model mixing dense and MoE layers, whose smaller instances keep a dense layer's
        tensors at more positions) gets a block of its own."""
        b = self.blocks.get(name)
        if b is None:
            b = self.blocks[name] = make(nbytes)
            return b
        if _nbytes(b) < nbytes:
            return make(nbytes)
        return b.view_of(nbytes) if hasattr(b, "view_of") else b[:nbytes]


def _nbytes(block) -> int:
    return block.nbytes if hasattr(block, "view_of") else block.numel()


# the whole-layer re-runs' work buffer against the replay (`ActivationPolicy.allocator_differs`: full recompute and
# checkpoint offload, whose re-run tensors the replay frees one by one; measured on an H200,
# reports/gpu-h200-2026-11-30.md)
RECOMPUTE_BUFFER_DIFFERS = (
    "keeps a layer's re-run tensors in one work buffer allocated for the whole run, where the simulator's "
    "caching-allocator replay frees each after the last backward op that reads it, as autograd does in the "
    "frameworks: the replay's allocated and reserved peaks are expected below this run's")


class ActivationPolicy(ABC):
    """Hands each layer the storage for its forward and backward and moves data in between.

    Call order in one step: ``begin_step``; per layer i ascending ``storage_for_forward(i)``,
    ``output_for(i)``, layer forward (which calls ``before_output_write(i)`` right before its
    last op writes the output), ``after_forward(i)``; per layer descending
    ``storage_for_backward(i)`` (which runs ``recompute``), layer backward, ``after_backward(i)``;
    ``end_step``.

    ``choice`` is the simulator's policy object (`memo_sim.policy`); what the executor keeps,
    offloads and recomputes comes from its attributes.

    A pipeline rank with several micro-batches in flight holds one instance per micro-batch in
    flight (`memo_exec.pipeline`): ``slot`` numbers the instance (the race detector's regions of
    two instances never alias), ``tag`` (e.g. ``"@c0.mb2"``) names the micro-batch it serves now
    in its copies' op names and ``layer_base`` is the model layer of its layer 0 in them (the
    instance numbers the layers of one model chunk from 0). A policy whose ``buffers`` are such that one
    micro-batch's action at a time uses them (``shares_buffers``: a recompute buffer, rebuilt before each layer's
    backward) takes them from ``shared`` (`SharedBlocks`, set by the pipeline before ``allocate``), so the rank
    holds one set whatever its slots, as the simulator counts it.
    """

    slot = 0
    tag = ""
    layer_base = 0
    moe_capacity: float | None = None  # the layout's MoE capacity factor (`make_policy`'s balance), None: none
    moe_etp: int = 1  # the layout's expert tensor-parallel size (`make_policy`'s etp)
    # where this executor runs a MoE block otherwise than the simulator's policy prices it: one
    # sentence for reports (`moe_block_note`), None where the two agree
    moe_block_differs: str | None = None
    # where this executor holds memory otherwise than the simulator's caching-allocator replay frees it: one sentence
    # for validation reports (`allocator_note`), None where the two agree
    allocator_differs: str | None = None
    # a policy that rebuilds whole layers: the shared buffer's tensors by name, every layer's but x (`recompute_buffer`)
    recompute_work: dict[str, torch.Tensor] | None = None
    shares_buffers = False  # `device_bytes`' "buffers" come from `buffer_block`: one set per rank (class docs)
    # `device_bytes` terms this policy cannot size before the step (autograd keeps them): the memory comparison
    # reads them as not estimated, neither 0 bytes nor a -100% error
    unsized_terms: tuple[str, ...] = ()
    shared: SharedBlocks | None = None
    slot_blocks: SlotBlocks | None = None  # a pipeline slot's blocks, shared with its other sizes' instances
    pipelined = False  # one of a pipeline rank's instances (set before `device_bytes` and `allocate`)

    def __init__(self, choice, model: ModelConfig, batch: int, seq: int, layers: int, dtype: torch.dtype,
                 device: torch.device, engine, timer, compute: LayerCompute | None,
                 shapes: dict[str, tuple[int, int]] | None = None) -> None:
        from memo_exec.activations.registry import sim_policy_name  # noqa: PLC0415

        self.choice = choice
        self.name = sim_policy_name(choice)
        self.model, self.batch, self.seq, self.layers = model, batch, seq, layers
        self.tokens = batch * seq
        self.dtype, self.device = dtype, device
        self.engine, self.timer, self.compute = engine, timer, compute
        self.storages: list[LayerStorage] = []
        # (rows per local token, width) of each skeletal tensor on this rank (`memo_exec.layer.storage_shapes`)
        self.shapes = shapes if shapes is not None else storage_shapes(model)

    # -- sizes, known before anything is allocated -----------------------------------------------
    @abstractmethod
    def device_bytes(self) -> dict[str, int]:
        """Bytes this policy preallocates on the device, by the simulator's memory terms:
        ``skeletal_resident``, ``buffers`` (rounding buffers, or the recompute buffer), ``lse``, ``norm_stats``."""

    def host_bytes(self) -> int:
        return 0

    def lse_bytes_per_layer(self) -> int:
        rows, width = self.shapes["q"]  # lse: one fp32 per (query row, head) of this rank
        return (width // self.model.qk_head_dim) * rows * self.tokens * 4

    def moe_kept_bytes(self, keeps_graph=lambda i: False, rebuilt: tuple[str, ...] = ()) -> int:
        """What this instance's MoE layers keep beside the policy's storage (`memo_exec.moe.memory`): every MoE
        layer its routing, a layer ``i`` with ``keeps_graph(i)`` also its block's autograd graph. Layer i is model
        layer ``layer_base + i``; a pipeline chunk is bound to its layers after the estimate, so where the model
        mixes dense and MoE layers and this instance holds part of them the count is the most MoE layers (and
        graphs) any run of this many layers holds; ``rebuilt``: the graph's tensors it does not keep (names of
        `memo_exec.moe.memory.graph_bytes`)."""
        m = self.model
        if not m.moe:
            return 0
        esize, tp = self._moe_sizes()
        per = {g: layer_kept_bytes(m, self.tokens, esize, tp, g, self.moe_capacity, self.moe_etp, rebuilt)
               for g in (False, True)}

        def total(base: int) -> int:
            return sum(per[bool(keeps_graph(i))] for i in range(self.layers) if self.moe_layer(base + i))

        if not m.mixes_dense_layers or self.layers >= m.layers:
            return total(self.layer_base)
        return max(total(b) for b in range(m.layers - self.layers + 1))

    def moe_graph_bytes(self) -> int:
        """One MoE layer's block graph beyond its routing (what a layer that keeps its graph adds; 0 for a dense
        model)."""
        if not self.model.moe:
            return 0
        esize, tp = self._moe_sizes()
        return (layer_kept_bytes(self.model, self.tokens, esize, tp, True, self.moe_capacity, self.moe_etp)
                - layer_kept_bytes(self.model, self.tokens, esize, tp, False, self.moe_capacity, self.moe_etp))

    def _moe_sizes(self) -> tuple[int, int]:
        """(the model dtype's bytes, the TP-split width's divisor) of `memo_exec.moe.memory`'s formulas."""
        esize = torch.empty((), dtype=self.dtype, device="meta").element_size()
        return esize, skeletal_widths(self.model)["fc1"] // self.shapes["fc1"][1]

    def moe_graph_part(self, name: str) -> int:
        """One MoE layer's kept-graph tensor ``name`` on this rank (`memo_exec.moe.memory.graph_bytes`; 0 for a
        dense model)."""
        if not self.model.moe:
            return 0
        esize, tp = self._moe_sizes()
        return graph_bytes(self.model, self.tokens, esize, tp, capacity=self.moe_capacity, etp=self.moe_etp)[name]

    def moe_layer(self, layer: int) -> bool:
        """Whether model layer ``layer`` of a MoE model has a MoE block (`ModelConfig.dense_layer_at`)."""
        return not self.model.dense_layer_at(layer)

    def layer_names(self, names: tuple[str, ...], i: int) -> tuple[str, ...]:
        """The tensors of ``names`` this instance's layer ``i`` writes: less fc1 and act where that layer is a MoE
        layer (its block replaces them and keeps its own, `memo_exec.moe.block`; the simulator's MoE layer has
        neither). A pipeline chunk is bound to its layers after allocation (`moe_kept_bytes`), so an instance
        holding part of a model that mixes dense and MoE layers keeps them at every position some run of this many
        layers puts a dense layer at (DeepSeek-V3's first 3 on a stage of 4: positions 0-2)."""
        m = self.model
        if not m.moe:
            return names
        if self.layers >= m.layers:
            dense = m.dense_layer_at(self.layer_base + i)
        else:
            dense = any(m.dense_layer_at(b + i) for b in range(m.layers - self.layers + 1))
        return names if dense else tuple(n for n in names if n not in ("fc1", "act"))

    def buffer_block(self, name: str, nbytes: int) -> torch.Tensor:
        """A device block of the policy's ``buffers`` term: the rank's shared one (``shared``) or its own."""
        if self.shared is None:
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self.shared.block(name, nbytes, self.device)

    def layer_block(self, name: str, nbytes: int) -> torch.Tensor:
        """A device block this instance's layers alone use (a layer's saved tensors): its own, or on a pipeline rank
        its slot's block ``name`` (`SlotBlocks`)."""
        def make(n: int) -> torch.Tensor:
            return torch.empty(n, dtype=torch.uint8, device=self.device)

        return make(nbytes) if self.slot_blocks is None else self.slot_blocks.take(name, nbytes, make)

    def _stats(self, name: str = "stats") -> torch.Tensor:
        """A layer's norm statistics (4 x tokens; ``name``: which layer's, for a slot's shared blocks)."""
        dt = norm_stats_dtype(self.dtype, self.device)
        if self.slot_blocks is None:
            return torch.empty(4, self.tokens, dtype=dt, device=self.device)
        nb = 4 * self.tokens * torch.empty((), dtype=dt, device="meta").element_size()
        return self.layer_block(name, nb).view(dt).view(4, self.tokens)

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

    def bind(self, kind: str, chunk: int, mb: int) -> None:
        """A pipeline rank's schedule runs the instance for the forward or backward (``kind``) of (chunk, mb)
        next; a policy whose buffers are the rank's numbers its layers then (MEMO); others need nothing."""
        return None

    # -- per layer ---------------------------------------------------------------------------------
    def storage_for_forward(self, i: int) -> LayerStorage:
        return self.storages[i]

    def output_for(self, i: int) -> torch.Tensor | None:
        """Where layer i writes its output (the next layer's x), or None for a fresh tensor."""
        return self.storages[i + 1].x if i + 1 < self.layers else None

    def before_output_write(self, i: int) -> None:
        """Called by layer i's forward right before its last op writes ``output_for(i)``."""
        return None

    def after_forward(self, i: int) -> None:
        return None

    def recompute(self, compute: LayerCompute, weights: LayerWeights, storage: LayerStorage, i: int) -> None:
        """Rebuild what the forward did not keep, before layer i's backward (also run by the dry run
        that records the layer's memory requests)."""
        return None

    def storage_for_backward(self, i: int, weights: LayerWeights) -> LayerStorage:
        s = self.storages[i]
        self.recompute(self.compute, weights, s, i)
        return s

    def after_backward(self, i: int) -> None:
        return None

    def offloaded(self, i: int) -> bool:
        return False

    def recompute_buffer(self) -> LayerStorage | None:
        """A policy that rebuilds whole layers before their backward (``recompute_work`` set by its ``allocate``):
        a storage over the buffer it rebuilds them in (every skeletal tensor but x, and the norm statistics), which
        no layer needs from the last layer's forward to the first layer's recompute, so another layer may run in it
        meanwhile (a checkpointed multi-token-prediction module, `memo_exec.mtp.ModuleRecompute`); else None."""
        if self.recompute_work is None:
            return None
        return LayerStorage(dict(self.recompute_work), self.storages[0].stats)

    def describe(self) -> dict:
        return {"policy": self.name}
