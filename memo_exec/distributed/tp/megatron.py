"""Megatron-LM tensor parallelism, with or without its sequence parallelism (``tp_mode`` megatron).

Column-parallel qkv and fc1 (this rank's heads / FFN columns), row-parallel out_proj and fc2
(partial sums reduced), LayerNorms and the row-parallel biases replicated. The layer's math is
`memo_exec.layer.LayerCompute` itself; `MegatronComm` gives it the two collectives:

- with SP, ``gather`` all-gathers the sequence (``all_gather_into_tensor``) and ``reduce``
  reduce-scatters it (``reduce_scatter_tensor``), in the interleaved token order of
  `memo_exec.distributed.context.local_token_index` (gathered row t*p + j is rank j's local
  row t): the collective runs rank-major; the gather reorders piece by piece inside its one
  full-length output (`gather_interleaved`), the reduce-scatter through a strided copy;
- without SP, ``gather`` is the identity (every rank holds every token) and ``reduce`` is an
  all-reduce;
- where the plan keeps the gathered inputs of the column-parallel GEMMs for their weight gradients
  (``sp_input_kept``: torch's ColwiseParallel, torchtitan's), ``gather_into`` gathers ln1 / ln2 into the
  layer's storage (`memo_exec.layer.storage_shapes`: the group's rows) and the backward reads them there,
  gathering nothing again; Megatron-LM's SP keeps the rank's shard and gathers it again.

The plan's level-1 memory plan (`memo_sim.memplan`) places this rank's layer scratch: `MegatronTP.sizes_only_compute`
records its requests on the meta device (`SizesOnlyComm` asks for the buffers `MegatronComm` asks for), and
`PLAN_NAMES` maps the simulator's names of the TP buffers to the executor's.

The embedding and the classifier outside the layers hold the rank's vocabulary rows under every flavour
(`memo_exec.vocab_parallel`, built by the runner from the flavour's group).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from memo_exec.distributed.collectives import gather_interleaved, reduce_scatter_single
from memo_exec.distributed.tp.base import TPFlavour
from memo_exec.distributed.tp.registry import register_tp
from memo_exec.layer import LayerCompute, LayerWeights, TPComm, storage_shapes
from memo_exec.moe import weights as moe_weights


class MegatronComm(TPComm):
    def __init__(self, group, size: int, sp: bool, kept: bool = False) -> None:
        self.group, self.size, self.sp = group, size, sp
        self.kept = sp and kept  # the gathered GEMM inputs kept in the layer's storage (the plan's sp_input_kept)
        self.row_mult = size if sp else 1
        self.timer = None  # set by the runner: each collective is a span on the "comm" stream

    def _span(self, op: str, t: torch.Tensor):
        if self.timer is None:
            return contextlib.nullcontext()
        return self.timer.span(op, None, "comm", stream="comm", nbytes=t.numel() * t.element_size())

    def gather(self, t: torch.Tensor, X, name: str) -> torch.Tensor:
        """The sequence all-gathered into one full-length buffer ``name`` in the interleaved order (gathered row
        t*p + j is rank j's local row t), with no second full-length buffer: `gather_interleaved`."""
        if not self.sp:
            return t
        n, w = t.shape
        out = X.get(name, (n * self.size, w), t.dtype)
        self.gather_into(t, out)
        return out

    def gather_into(self, t: torch.Tensor, out: torch.Tensor) -> None:
        with self._span("tp_all_gather", out):
            gather_interleaved(out, t.contiguous(), self.size, self.group)

    def release(self, X, name: str) -> None:
        if self.sp:
            X.free(name)

    def reduce(self, partial: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if not self.sp:
            with self._span("tp_all_reduce", partial):
                dist.all_reduce(partial, group=self.group)
            if out.data_ptr() != partial.data_ptr():
                out.copy_(partial)
            return out
        n, w = out.shape
        rank_major = partial.view(n, self.size, w).transpose(0, 1).reshape(self.size * n, w)
        with self._span("tp_reduce_scatter", rank_major):
            if out.is_contiguous():
                reduce_scatter_single(out, rank_major, group=self.group)
            else:
                tmp = torch.empty_like(out, memory_format=torch.contiguous_format)
                reduce_scatter_single(tmp, rank_major, group=self.group)
                out.copy_(tmp)
        return out


class SizesOnlyComm(MegatronComm):
    """MegatronComm's scratch requests without communicating (a layer trace on the meta device:
    one rank's transient buffers, `memo_exec.trace`)."""

    def gather(self, t: torch.Tensor, X, name: str) -> torch.Tensor:
        if not self.sp:
            return t
        n, w = t.shape
        return X.get(name, (n * self.size, w), t.dtype)  # gathered in place (`gather_interleaved`)

    def gather_into(self, t: torch.Tensor, out: torch.Tensor) -> None:
        return None

    def reduce(self, partial: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out


# The simulator's names of a TP rank's buffers (phase -> {plan name: executor name}) where the two differ; the sizes
# agree (checked on tp 2 with and without SP, 7B and a toy model: every placed tensor's bytes equal the executor's
# request). The simulator names a gather by the GEMM that reads it (memo_sim/memplan/trace_gen.py
# ``_layer_forward_trace``: ``{op}_input_gathered``; ``_layer_backward_trace``: ``{op}_input_regathered``, and the
# out_proj backward's gather of its output's gradient ``d_proj_gathered``), its recompute's by memo_sim/tp/base.py
# ``TPFlavour.recompute_scratch`` (``recompute_ln*_gathered``, and ``rc_proj``: the full-length partial sum of the
# re-run out_proj, which the executor reduces into ``rc_proj``, the rank's rows, a tensor the plan does not place);
# the executor by the gathered tensor (memo_exec/layer.py ``LayerCompute``: ``ln1_gathered``, ``ln2_gathered``,
# ``d_h1_gathered``; its recompute's under the ``rc_`` prefix, and ``{name}_partial`` for a partial sum,
# ``LayerCompute._row_parallel``).
PLAN_NAMES = {
    "fwd": {"qkv_input_gathered": "ln1_gathered", "fc1_input_gathered": "ln2_gathered"},
    "bwd": {"qkv_input_regathered": "ln1_gathered", "fc1_input_regathered": "ln2_gathered",
            "d_proj_gathered": "d_h1_gathered", "recompute_ln1_gathered": "rc_ln1_gathered",
            "recompute_ln2_gathered": "rc_ln2_gathered", "rc_proj": "rc_proj_partial"},
}


@register_tp("megatron")
class MegatronTP(TPFlavour):
    def __init__(self, ctx, model) -> None:
        super().__init__(ctx, model)
        self.sp = bool(ctx.layout.sp) and self.size > 1
        self.kept = self.sp and ctx.layout.sp_input_kept  # torch TP's kept inputs (`memo_exec.layer.storage_shapes`)
        self.comm = MegatronComm(self.group, self.size, self.sp, self.kept) if self.size > 1 else TPComm()

    def check(self) -> str | None:
        m, p = self.model, self.size
        if m.heads % p or m.n_kv_heads % p:
            return f"{m.heads} heads / {m.n_kv_heads} KV heads are not divisible by tp = {p}"
        if m.ffn % p:
            return f"ffn {m.ffn} is not divisible by tp = {p}"
        return None

    @property
    def row_mult(self) -> int:
        return self.comm.row_mult

    def storage_shapes(self) -> dict[str, tuple[int, int]]:
        return storage_shapes(self.model, self.size, self.sp, self.kept)

    def make_weights(self, layers: int, device, dtype, layer: int | None = None,
                     experts: tuple[int, int] | None = None, moe: bool | None = None,
                     expert_tp: tuple[int, int] = (1, 0)) -> LayerWeights:
        """One layer's shard; a MoE layer (``layer``; ``moe``: its kind given, a multi-token-prediction module's)
        holds routed experts ``experts`` = (first, count), slice ``expert_tp`` = (etp, ETP rank) of each."""
        return LayerWeights(self.model, layers, device, dtype, tp=self.size, layer=layer, experts=experts, moe=moe,
                            expert_tp=expert_tp)

    # -- which slice of a whole parameter this rank holds ---------------------------------------
    def _row_blocks(self, name: str) -> list[tuple[int, int]]:
        """(start, length) blocks along dim 0 of a whole row-split parameter that are this rank's."""
        m, p, r = self.model, self.size, self.rank
        if name in ("wqkv", "bqkv"):
            h, kv = m.q_dim, m.kv_dim
            return [(r * h // p, h // p), (h + r * kv // p, kv // p), (h + kv + r * kv // p, kv // p)]
        if name == "sinks":  # one per query head
            return [(r * m.heads // p, m.heads // p)]
        name = name.split(".")[-1]
        f = m.shared_width if name == "shared_w1" else m.ffn
        if name in ("w1", "shared_w1") and m.ffn_type == "swiglu":
            return [(r * f // p, f // p), (f + r * f // p, f // p)]
        whole = m.fc1_width if name == "w1" else f
        return [(r * whole // p, whole // p)]

    @staticmethod
    def _kind(name: str) -> str:
        """rows / cols (split over TP) or whole, for a parameter name (a MoE block's under ``moe.``)."""
        leaf = name.split(".")[-1]
        if name.startswith("moe."):
            return "rows" if leaf in moe_weights.TP_ROWS else "cols" if leaf in moe_weights.TP_COLS else "whole"
        return "rows" if leaf in LayerWeights.TP_ROWS else "cols" if leaf in LayerWeights.TP_COLS else "whole"

    def _slices(self, name: str, full: torch.Tensor) -> torch.Tensor:
        if self._kind(name) == "rows":
            return torch.cat([full.narrow(0, s, n) for s, n in self._row_blocks(name)], 0)
        if self._kind(name) == "cols":
            w = full.shape[1] // self.size
            return full.narrow(1, self.rank * w, w)
        return full

    def replicated(self, param_name: str) -> bool:
        """Whole on every TP rank (a MoE layer's router, shared gate and, where ep = etp = 1, its routed experts)."""
        return self._kind(param_name) == "whole"

    @torch.no_grad()
    def shard_(self, local: LayerWeights, full: LayerWeights) -> None:
        """Copy this rank's shard of ``full``; routed experts are not in ``full`` (drawn by expert index)."""
        for name, p in local.named_parameters():
            if name.startswith("moe.expert_"):
                continue
            p.copy_(self._slices(name, full.get_parameter(name)))

    def unshard_grads(self, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every parameter's whole gradient (all-gather over the TP group; a collective)."""
        out = {}
        for name, g in grads.items():
            if self.size == 1 or self.replicated(name):
                out[name] = g.detach().clone()
                continue
            parts = [torch.empty_like(g) for _ in range(self.size)]
            dist.all_gather(parts, g.contiguous(), group=self.group)
            if self._kind(name) == "cols":
                out[name] = torch.cat(parts, 1)
                continue
            blocks = [[] for _ in self._row_blocks(name)]
            for part in parts:  # each rank's rows are its blocks, concatenated
                off = 0
                for i, (_, n) in enumerate(self._row_blocks(name)):
                    blocks[i].append(part.narrow(0, off, n))
                    off += n
            out[name] = torch.cat([torch.cat(b, 0) for b in blocks], 0)
        return out

    def make_compute(self, batch: int, seq: int, dtype, device, backend, scratch, timer) -> LayerCompute:
        return LayerCompute(self.model, batch, seq, dtype, device, backend, scratch, timer, tp=self.comm)

    @classmethod
    def plans_memory(cls) -> bool:
        """True where the layer is `LayerCompute` over `MegatronComm` (this class's ``make_compute``): the one
        `sizes_only_compute` records. A subclass with its own layer (METP's rings, `memo_exec.metp.flavour`) has no
        dry run here."""
        return cls.make_compute is MegatronTP.make_compute

    def sizes_only_compute(self, batch: int, seq: int, dtype, backend, scratch) -> LayerCompute | None:
        """This rank's layer on the meta device, its collectives' scratch requests without communicating."""
        if not self.plans_memory():
            return None
        comm = SizesOnlyComm(None, self.size, self.sp, self.kept) if self.size > 1 else self.comm
        return LayerCompute(self.model, batch, seq, dtype, torch.device("meta"), backend, scratch, tp=comm)

    def plan_names(self) -> dict[str, dict[str, str]]:
        return PLAN_NAMES if self.size > 1 and self.plans_memory() else {}


